# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla-edge-generate: greedy text from the hand-written engine, the first thing to run with a new checkpoint.

It loads the model exactly as the node does (an HF directory or a GGUF file), tokenizes the prompt with the
checkpoint's own tokenizer (`--chat`: through its chat template, as the user turn) and prints the greedy
continuation over the full vocabulary. If the text reads right, the weights, the tokenizer and the forward
pass are right.

For instance:
  vla-edge-generate --model qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --prompt "def fibonacci(n):" --tokens 16
  vla-edge-generate --model /models/qwen --chat --prompt "Name three colours." --backend cuda
  vla-edge-generate --model /tmp/tiny --prompt-ids 1,2,3 --tokens 8        # a model without a tokenizer

Exit status: 0 done; 2 a bad option (also: --system without --chat, a --prompt that is not valid UTF-8, a prompt +
--tokens past the model's context or over the memory the cache and the prefill would need); 3 a model that cannot
load (one line naming the file and tensor), a model without a tokenizer for --prompt, or a forward pass that
overflows. Every refusal is one line, before anything large is allocated.
"""
from __future__ import annotations

import json
import sys

from .cli import Parser, bounded, fail

MAX_PROMPT_CHARS = 1 << 16
MAX_PROMPT_ID_CHARS = 1 << 22  # --prompt-ids text: ~400,000 ids at most are even parsed (each is then range-checked)
MAX_TOKENS = 4096


def _utf8_problem(option: str, text: str | None) -> str | None:
    """Why `text` (from argv: undecodable bytes arrive as lone surrogates) cannot be encoded, or None."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"{option} is not valid UTF-8 (an undecodable byte or a lone surrogate at character {e.start})"
    return None


def _available_bytes() -> int | None:
    """Memory this process may still take: the lower of MemAvailable and the address-space limit (None: unknown)."""
    limits = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            limits.append(soft)
    except (ImportError, OSError, ValueError):
        pass
    return min(limits) if limits else None


def context_problem(cfg, n_prompt: int, n_tokens: int, backend: str) -> str | None:
    """Why a prompt of `n_prompt` ids + `n_tokens` generated ones cannot run on the model `cfg`: past its context
    (max_position_embeddings), or (the NumPy backend) more host memory than is available for the cache (k, rotated k,
    v in float32 a layer) and one prefill block (textgen.PREFILL_BLOCK queries against the whole cache); None when
    it can."""
    from ..textgen import prefill_bytes

    need = n_prompt + n_tokens
    ctx = int(cfg.max_position_embeddings)
    if need > ctx:
        return (f"the prompt is {n_prompt} tokens and --tokens {n_tokens}: {need} positions, past the model's context "
                f"of {ctx} (max_position_embeddings); shorten the prompt")
    if backend != "cuda":
        est, avail = prefill_bytes(cfg, need), _available_bytes()
        if avail is not None and est > avail:
            return (f"the prompt is {n_prompt} tokens and --tokens {n_tokens}: the NumPy cache and prefill need about "
                    f"{est / 2**30:.1f} GiB, more than the {avail / 2**30:.1f} GiB available; shorten the prompt")
    return None


def _ids(text: str) -> list[int]:
    if len(text) > MAX_PROMPT_ID_CHARS:
        raise ValueError(f"--prompt-ids is {len(text)} characters (at most {MAX_PROMPT_ID_CHARS})")
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--prompt-ids must be comma-separated integers, got {text[:40]!r}") from None
    if not ids:
        raise ValueError("--prompt-ids is empty")
    return ids


def main(argv=None) -> int:
    ap = Parser(prog="vla-edge-generate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model directory (HF layout) or GGUF file")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text, tokenized with the model's tokenizer")
    src.add_argument("--prompt-ids", help="prompt as comma-separated token ids (models without a tokenizer)")
    ap.add_argument("--chat", action="store_true", help="wrap --prompt in the model's chat template (user turn)")
    ap.add_argument("--system", help="with --chat: a system message (default: the template's own)")
    ap.add_argument("--tokens", type=bounded(1, MAX_TOKENS, int), default=32, help="tokens to generate")
    ap.add_argument("--backend", choices=("auto", "numpy", "cuda"), default="auto", help="engine backend")
    ap.add_argument("--no-stop", action="store_true", help="do not stop at an end-of-text token")
    ap.add_argument("--json", action="store_true", help="print one JSON object (ids, text, timings)")
    a = ap.parse_args(argv)
    if a.prompt is not None and len(a.prompt) > MAX_PROMPT_CHARS:
        ap.error(f"--prompt is {len(a.prompt)} characters (at most {MAX_PROMPT_CHARS})")
    if (a.chat or a.system is not None) and a.prompt is None:
        ap.error("--chat / --system need --prompt (text, through the tokenizer)")
    if a.system is not None and not a.chat:
        ap.error("--system needs --chat (the system message is a turn of the model's chat template)")
    for option, text in (("--prompt", a.prompt), ("--system", a.system)):
        why = _utf8_problem(option, text)
        if why:
            ap.error(why)

    from ..model.chat_template import TemplateRefused
    from ..model.checkpoint import Checkpoint, check_model_path
    from ..model.safetensors_io import ModelLoadError
    from ..model.tokenizer import tokenizer_problem

    problem = check_model_path(a.model)
    if problem:
        return fail("vla-edge-generate", problem, 3)
    try:
        checkpoint = Checkpoint(a.model)  # opened once: config, tokenizer, then the weights
        cfg = checkpoint.config  # the context and the shapes, before any weight is read
        tok = checkpoint.tokenizer
        if a.prompt is not None:
            if tok is None:
                return fail("vla-edge-generate", f"{tokenizer_problem(a.model)}: use --prompt-ids", 3)
            text = a.prompt
            if a.chat:
                messages = ([{"role": "system", "content": a.system}] if a.system is not None else []) + \
                    [{"role": "user", "content": a.prompt}]
                text = tok.render_chat(messages)
            prompt_ids = tok.encode(text)
            if not prompt_ids:
                ap.error("--prompt encodes to no tokens")
        else:
            prompt_ids = _ids(a.prompt_ids)
        backend = a.backend if a.backend != "auto" else ("cuda" if _cuda_usable() else "numpy")
        why = context_problem(cfg, len(prompt_ids), a.tokens, backend)
        if why:
            ap.error(why)
        weights = checkpoint.weights
    except (ModelLoadError, TemplateRefused) as e:  # a bad file, or its chat template over a bound: the model's fault
        return fail("vla-edge-generate", str(e), 3)
    except ValueError as e:
        ap.error(str(e))
    vocab = weights.cfg.vocab_size
    if any(not 0 <= i < vocab for i in prompt_ids):
        ap.error(f"prompt token ids must lie in 0..{vocab - 1}")

    from ..engine import EngineError
    from ..textgen import NonFiniteLogits, generate, text_model

    try:
        model = text_model(weights, backend, len(prompt_ids) + a.tokens)
        stop = () if a.no_stop or tok is None else tok.eos_ids
        g = generate(model, prompt_ids, a.tokens, stop)
    except (EngineError, NonFiniteLogits, ValueError) as e:
        return fail("vla-edge-generate", str(e), 3)
    text = tok.decode(g.ids, skip_special=True) if tok is not None else None
    if a.json:
        print(json.dumps({"backend": model.name, "prompt_ids": g.prompt_ids, "ids": g.ids, "text": text,
                          "stopped": g.stopped, "prefill_s": g.prefill_s, "decode_s": g.decode_s,
                          "tokens_per_s": g.tokens_per_s}))
        return 0
    print(f"[{model.name}, {weights.cfg.weight_format}, prompt {len(g.prompt_ids)} tokens, prefill "
          f"{g.prefill_s * 1e3:.0f} ms, {len(g.ids)} tokens at {g.tokens_per_s:.1f} tokens/s"
          f"{', stopped at end of text' if g.stopped else ''}]", file=sys.stderr)
    print(text if text is not None else ",".join(map(str, g.ids)))
    return 0


def _cuda_usable() -> bool:
    from ..engine import cuda_available

    return bool(cuda_available())


if __name__ == "__main__":
    sys.exit(main())
