# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The checkpoint's own tokenizer and chat template, through maintained libraries (`tokenizers`, `jinja2`).

Sources, in this order: `tokenizer.json` in an HF model directory (its chat template from
`tokenizer_config.json`), or the vocabulary, merges, token types and chat template a GGUF file stores as
metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`), rebuilt as the byte-level BPE it describes: the
Qwen2 pre-tokenizer split, byte-level mapping, NFC normalization (as Qwen2's own tokenizer.json), control
tokens as special tokens, user-defined tokens as added tokens. A model without either has no tokenizer
(`load_tokenizer` returns None and `tokenizer_problem` says why in one line).

The chat template is rendered bounded, in a child process (`chat_template.TemplateRenderer`).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from .chat_template import MAX_RENDER_CHARS, RENDER_BUDGET_S, RENDER_START_S, TemplateRefused, renderer
from .converted_cache import lookup
from .gguf import _bytes_to_unicode, is_gguf
from .safetensors_io import ModelLoadError

MAX_TOKENIZER_BYTES = 64 << 20  # Qwen2.5's tokenizer.json is 7 MB
MAX_TEMPLATE_CHARS = 1 << 16
# Qwen2's pre-tokenizer split (the pattern of its tokenizer.json / llama.cpp's "qwen2" pre-type).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
GGUF_PRE_SPLITS = {"qwen2": QWEN2_SPLIT, "deepseek-r1-qwen": QWEN2_SPLIT}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types


@dataclass
class TextTokenizer:
    """A `tokenizers.Tokenizer` plus the checkpoint's chat template and end-of-turn ids."""

    tok: object  # tokenizers.Tokenizer
    source: str
    chat_template: str | None = None
    eos_ids: tuple[int, ...] = ()
    bos_token: str | None = None
    eos_token: str | None = None
    special_ids: frozenset = field(default_factory=frozenset)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in it ("<|im_start|>") are matched whole."""
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids, skip_special: bool = False) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, budget_s: float = RENDER_BUDGET_S,
                    start_s: float = RENDER_START_S) -> str:
        """`messages` ([{"role", "content"}]) through the checkpoint's chat template, bounded (`TemplateRenderer`):
        raises TemplateRefused (a ValueError, one line) without a template, or when it fails or exceeds a bound.
        `start_s`: how long to wait for the render child to start (0 on the control path: refused while it starts)."""
        if not self.chat_template:
            raise TemplateRefused(f"{self.source} has no chat template")
        context = {"messages": messages, "add_generation_prompt": add_generation_prompt,
                   "bos_token": self.bos_token or "", "eos_token": self.eos_token or "", "tools": None}
        return renderer().render(self.chat_template, context, budget_s, MAX_RENDER_CHARS, start_s)


def tokenizer_files(tok: TextTokenizer) -> dict[str, bytes]:
    """`tok` as the files of an HF model directory (tokenizer.json, tokenizer_config.json with the chat template and
    the bos / eos tokens): what the converted-weights cache stores for a GGUF, read back by _from_tokenizer_json."""
    cfg = {"chat_template": tok.chat_template, "eos_token": tok.eos_token, "bos_token": tok.bos_token}
    return {"tokenizer.json": tok.tok.to_str().encode("utf-8"),
            "tokenizer_config.json": json.dumps({k: v for k, v in cfg.items() if v is not None}).encode("utf-8")}


def _from_tokenizer_json(model_dir: str, source: str | None = None) -> TextTokenizer:
    """The tokenizer of an HF model directory; `source`: the name messages give it (default its tokenizer.json)."""
    from tokenizers import Tokenizer

    path = os.path.join(model_dir, "tokenizer.json")
    if os.path.getsize(path) > MAX_TOKENIZER_BYTES:
        raise ModelLoadError(path, f"{os.path.getsize(path)} bytes: too large for a tokenizer")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception on a malformed file
        raise ModelLoadError(path, f"not a readable tokenizer ({type(e).__name__}: {str(e)[:200]})") from None
    template, eos, bos = None, None, None
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.isfile(cfg_path) and os.path.getsize(cfg_path) <= MAX_TOKENIZER_BYTES:
        try:
            with open(cfg_path, encoding="utf-8") as f:
                tc = json.load(f)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            tc = {}
        if isinstance(tc, dict):
            template = tc.get("chat_template") if isinstance(tc.get("chat_template"), str) else None
            eos = _token_text(tc.get("eos_token"))
            bos = _token_text(tc.get("bos_token"))
    specials = frozenset(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
    rows = _config_rows(model_dir)
    if rows is not None:
        check_tokenizer_fits(path, tok.get_vocab_size(with_added_tokens=True), rows)
    eos_ids = tuple(i for i in (tok.token_to_id(t) for t in (eos, "<|im_end|>", "<|endoftext|>") if t) if i is not None)
    return TextTokenizer(tok, source or path, _bounded_template(template), tuple(dict.fromkeys(eos_ids)), bos, eos,
                         specials)


def _config_rows(model_dir: str) -> int | None:
    """The embedding rows config.json declares (None when unreadable: loading the model reports that)."""
    try:
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
            v = json.load(f).get("vocab_size")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _token_text(v):
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def _bounded_template(t):
    return t if isinstance(t, str) and 0 < len(t) <= MAX_TEMPLATE_CHARS else None


def build_gguf_tokenizer(path: str) -> TextTokenizer | None:
    """The tokenizer a GGUF file's metadata describes, from the file itself (None: it has none)."""
    try:
        return _from_gguf(path)
    except LookupError:
        return None


def _from_gguf(path: str) -> TextTokenizer:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    from .gguf import _open, field

    reader = _open(path)
    model = field(reader, "tokenizer.ggml.model")
    if model is None:
        raise LookupError(f"{path} has no tokenizer (no tokenizer.ggml.* metadata)")
    if model != "gpt2":
        raise ModelLoadError(path, f"tokenizer.ggml.model {model!r} is not supported (byte-level BPE 'gpt2' only)")
    tokens = field(reader, "tokenizer.ggml.tokens")
    merges = field(reader, "tokenizer.ggml.merges", [])
    types = field(reader, "tokenizer.ggml.token_type")
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    rows = int(embed.shape[-1]) if embed is not None and len(embed.shape) else None  # ne order: [hidden, vocab]
    spelled = set(_bytes_to_unicode().values())
    _check_gguf_vocabulary(path, tokens, merges, types, rows)
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t if set(t) <= spelled else "".join(_bytes_to_unicode()[b] for b in t.encode()), i)
    pairs = _merge_pairs(path, merges, vocab)
    tok = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    pre = GGUF_PRE_SPLITS.get(field(reader, "tokenizer.ggml.pre"), QWEN2_SPLIT)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pre), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    control = [t for t, k in zip(tokens, types) if k == CONTROL and set(t) <= spelled | set("<|>_")]
    user = [t for t, k in zip(tokens, types) if k == USER_DEFINED]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])

    def token_of(key):
        i = field(reader, f"tokenizer.ggml.{key}")
        return (int(i), tokens[int(i)]) if isinstance(i, int) and 0 <= i < len(tokens) else (None, None)

    eos_id, eos = token_of("eos_token_id")
    _, bos = token_of("bos_token_id")
    eos_ids = [eos_id] + [tok.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>")]
    template = field(reader, "tokenizer.chat_template")
    specials = frozenset(vocab[t] for t in control if t in vocab)
    return TextTokenizer(tok, path, _bounded_template(template),
                         tuple(dict.fromkeys(i for i in eos_ids if i is not None)), bos, eos, specials)


def _check_gguf_vocabulary(path: str, tokens, merges, types, rows: int | None) -> None:
    """A GGUF vocabulary the model can use, else one ModelLoadError line naming what disagrees: string tokens, no
    more than the embedding's rows, the 256 byte tokens a byte-level BPE needs, string merges, one token type per
    token (the control tokens are special tokens: without types an instruction could spell them)."""
    if not isinstance(tokens, list) or not tokens:
        raise ModelLoadError(path, "tokenizer.ggml.tokens missing or not a list")
    bad = next((i for i, t in enumerate(tokens) if not isinstance(t, str) or not t), None)
    if bad is not None:
        raise ModelLoadError(path, f"tokenizer.ggml.tokens[{bad}] is {tokens[bad]!r}, not a token string")
    if rows is not None:
        check_tokenizer_fits(path, len(tokens), rows)
    missing = sorted(set(_bytes_to_unicode().values()) - set(tokens))
    if missing:
        raise ModelLoadError(path, f"tokenizer.ggml.tokens ({len(tokens)} tokens) lacks {len(missing)} of the 256 "
                                   f"byte tokens a byte-level BPE needs (e.g. {missing[0]!r}): it cannot spell "
                                   "every text")
    if not isinstance(merges, list):
        raise ModelLoadError(path, "tokenizer.ggml.merges is not a list")
    bad = next((i for i, m in enumerate(merges) if not isinstance(m, str)), None)
    if bad is not None:
        raise ModelLoadError(path, f"tokenizer.ggml.merges[{bad}] is {merges[bad]!r}, not a merge string")
    if not isinstance(types, list) or len(types) != len(tokens):
        n = len(types) if isinstance(types, list) else "no"
        raise ModelLoadError(path, f"tokenizer.ggml.token_type holds {n} types for {len(tokens)} tokens: the "
                                   "special tokens cannot be told apart")
    bad = next((i for i, k in enumerate(types) if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= 6),
               None)
    if bad is not None:
        raise ModelLoadError(path, f"tokenizer.ggml.token_type[{bad}] is {types[bad]!r}, not a token type (0-6)")


def _merge_pairs(path: str, merges: list, vocab: dict) -> list[tuple[str, str]]:
    """The merges as pairs; one that names a token the vocabulary lacks, or makes one, is refused by index (the
    tokenizers library would raise or panic on it)."""
    pairs = []
    for i, m in enumerate(merges):
        a, sep, b = m.partition(" ")
        if not (sep and a and b) or " " in b:
            raise ModelLoadError(path, f"tokenizer.ggml.merges[{i}] {m[:60]!r} is not two tokens joined by a space")
        unknown = next((t for t in (a, b, a + b) if t not in vocab), None)
        if unknown is not None:
            raise ModelLoadError(path, f"tokenizer.ggml.merges[{i}] {m[:60]!r} names {unknown[:40]!r}, which the "
                                       "vocabulary lacks")
        pairs.append((a, b))
    return pairs


def check_tokenizer_fits(path: str, vocab_size: int, rows: int) -> None:
    """A tokenizer of `vocab_size` tokens (added ones included) against a model whose embedding has `rows` rows:
    more tokens than rows would give ids the model has no embedding for (ModelLoadError, one line). Fewer is
    normal (Qwen2.5's embedding is padded: 151,936 rows for 151,665 tokens)."""
    if vocab_size > rows:
        raise ModelLoadError(path, f"the tokenizer has {vocab_size} tokens but the model's embedding only {rows} rows: "
                                   "it is not this model's tokenizer")


# The last tokenizer built, by its files' identity: start-up asks twice for the same one (the prompt-length check
# before anything is allocated, then the engine), and building a GGUF's costs ~0.45 s. One entry: the model in use.
_LAST: dict = {}


def _files_key(path: str) -> tuple:
    """The files a tokenizer is built from, with their sizes and modification times (a changed file misses)."""
    names = [path] if is_gguf(path) else [os.path.join(path, n) for n in ("tokenizer.json", "tokenizer_config.json")]
    key = [os.path.realpath(path)]
    for n in names:
        try:
            st = os.stat(n)
            key.append((n, st.st_size, st.st_mtime_ns))
        except OSError:
            key.append((n, None))
    return tuple(key)


def load_tokenizer(path) -> TextTokenizer | None:
    """The tokenizer of the model at `path` (a GGUF file or a model directory), or None when it has none.
    A tokenizer that is present but broken raises ModelLoadError (one line). The last one built is reused while
    its files are unchanged (it is only read: encode, decode, the chat template)."""
    path = str(path)
    key = _files_key(path)
    if key in _LAST:
        return _LAST[key]
    tok = _build_tokenizer(path)
    _LAST.clear()
    _LAST[key] = tok
    return tok


def _build_tokenizer(path: str) -> TextTokenizer | None:
    if is_gguf(path):
        entry = lookup(path)  # the GGUF's converted entry holds its tokenizer (or, without the files, it has none)
        if entry is not None:
            has = os.path.isfile(os.path.join(entry, "tokenizer.json"))
            return _from_tokenizer_json(entry, source=path) if has else None
        return build_gguf_tokenizer(path)
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        return _from_tokenizer_json(path)
    return None


def tokenizer_problem(path) -> str:
    """One line: why the model at `path` has no tokenizer."""
    if is_gguf(path):
        return f"{path}: the GGUF file holds no tokenizer (no tokenizer.ggml.* metadata)"
    return f"{path}: no tokenizer.json in the model directory (generated models have none)"
