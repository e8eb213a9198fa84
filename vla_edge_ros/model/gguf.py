# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Load a Qwen2 GGUF file (llama.cpp's format, what llama_ros users hold) into the engine's bf16 weights.

The container (header, metadata, tensor table) is read by `GgufFile` below, in one bounded pass; the block types
are the `gguf` package's (llama.cpp's own Python dequantizer); nothing in the file is executed. Every weight is
dequantized to float32 by `gguf.quants.dequantize` and rounded once to bf16 (the
engine's weight type), so a GGUF model runs the bf16 path exactly up to that one rounding; `keep_f32=True`
keeps the float32 values for the golden model's fidelity measurements. A 4-bit run of a GGUF checkpoint is
its re-quantization to the engine's W4A16 format (`vla-edge-quantize model.gguf --format awq`).

Before anything is sized by the header, the tensor and metadata counts are checked against the file size; the
metadata is read with every string and array length checked against what is left of the file and against caps, and
their total against a cap, before it is read (a header that claims 2^61 entries is one line at once); and every
tensor's bytes must lie inside the file: a truncated file, a header whose counts or sizes
exceed the file, another architecture, an unsupported block type (named), a tensor of the wrong shape or a
vocabulary too small for the action range each raise one ModelLoadError line.

Tensor names (llama.cpp's) map to the HF layout the rest of the package uses:
token_embd -> embed, output_norm -> norm, output -> lm_head (absent: tied), blk.N.{attn_norm, attn_q, attn_k,
attn_v (+ .bias), attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}. Qwen2 GGUFs keep q/k in HF's order
(llama.cpp rotates them NEOX-style), so no row permutation is undone.
"""
from __future__ import annotations

import functools
import logging
import mmap
import os
import struct
from typing import NamedTuple

import numpy as np

from .config import MAX_INT, ModelConfig
from .safetensors_io import ModelLoadError, f32_to_bf16, release_pages
from .weights import LAYER_TENSORS, Weights, layer_shapes, weights_from_hf

log = logging.getLogger(__name__)

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_TENSORS = 1 << 16  # a 72-layer model has ~650
MAX_KV = 1 << 12
MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, a one-byte key, value type, a one-byte value
MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name length, name, n_dims, one dim, type, offset
# Metadata caps, checked before the reader runs. Qwen2.5's metadata: 151,936 tokens, ~151,000 merges, 151,936 token
# types, ~6 MB in all; the largest vocabularies published are ~262,000 tokens. The reader costs ~20 us per array
# entry on a small host, so the entry total bounds the time of a refusal-free read too.
MAX_ARRAY_ENTRIES = 1 << 20
MAX_TOTAL_ENTRIES = 1 << 21
MAX_STRING_BYTES = 1 << 20  # one string (a chat template is ~5-20 KB)
MAX_METADATA_BYTES = 64 << 20
MAX_ARRAY_DEPTH = 2  # an array of arrays at most
MAX_DIMS = 4  # GGML_MAX_DIMS
# value type -> size in bytes (GGUF: 0 uint8 ... 12 float64; 8 string and 9 array are read, not sized)
SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9

# Block types read here: what Q4_K_M / Q5_K_M / Q8_0 / F16 files of Qwen2.5 hold, and the other classic and
# k-quant types `gguf.quants` dequantizes in NumPy. The i-quants and ternary types are refused by name.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                   "Q6_K")

GGUF_LAYER = {  # short name (weights.LAYER_TENSORS) -> llama.cpp tensor name under blk.N.
    "ln1": "attn_norm.weight",
    "wq": "attn_q.weight", "bq": "attn_q.bias",
    "wk": "attn_k.weight", "bk": "attn_k.bias",
    "wv": "attn_v.weight", "bv": "attn_v.bias",
    "wo": "attn_output.weight",
    "ln2": "ffn_norm.weight",
    "wg": "ffn_gate.weight", "wu": "ffn_up.weight", "wd": "ffn_down.weight",
}


def is_gguf(path) -> bool:
    """`path` names a GGUF file: by its magic bytes when readable, else by its suffix."""
    path = str(path)
    if os.path.isfile(path):
        try:
            with open(path, "rb") as f:
                return f.read(4) == MAGIC
        except OSError:
            pass
    return path.lower().endswith(".gguf")


def _check_header(path: str) -> int:
    """The file's size, after checking the magic, the version and that the declared counts can fit in it."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:4] != MAGIC:
        raise ModelLoadError(path, "not a GGUF file (no 'GGUF' magic at the start)")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:])
    if version not in VERSIONS:
        raise ModelLoadError(path, f"GGUF version {version} (supported: {', '.join(map(str, VERSIONS))})")
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV or 24 + n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_INFO_BYTES > size:
        raise ModelLoadError(path, f"header declares {n_tensors} tensors and {n_kv} metadata keys, more than the "
                                   f"{size}-byte file can hold (corrupt or truncated)")
    return size


def _open(path: str):
    """The file's GgufFile (header, metadata and tensor table read and checked); kept for the process while the file
    is unchanged (the config, the tokenizer and the weights each need it)."""
    st = os.stat(path)
    return _open_checked(path, st.st_size, st.st_mtime_ns)


# value type -> struct format (GGUF: 0 uint8 ... 12 float64; 8 string and 9 array are read, not sized)
SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                  12: "<d"}
SCALAR_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8",
                 11: "<i8", 12: "<f8"}
UINT32 = 4
_U64 = struct.Struct("<Q")
UNREADABLE = object()  # a metadata value that is not valid UTF-8: `field` gives the caller's default for it


class GgufTensor(NamedTuple):
    """One tensor of the table, as gguf.GGUFReader describes it: `shape` in ggml's order (innermost first), `data`
    a read-only view of its bytes in the file (a float type typed and shaped [outer..., inner]; a block type as
    uint8 [outer..., bytes of a row], what gguf.quants.dequantize takes)."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


class GgufFile:
    """A GGUF file's header, metadata (decoded: `fields` maps each key to its str, number, bool or list) and tensor
    table, read over a memory map in two passes with the same checks: the first only walks (every length checked
    against what is left of the file and the caps above, nothing allocated, so a hostile file is refused before
    anything is sized by it), the second decodes. Tensor data is not read: each tensor's `data` views the map.

    gguf.GGUFReader reads the same layout, but keeps a NumPy view per metadata entry: ~20 s on this 2-core host for
    the 455,000 entries of Qwen2.5's vocabulary, where these two passes take ~0.5 s. The container is all it
    replaces: the block types are dequantized by `gguf.quants`, and test_gguf checks this reader against GGUFReader."""

    def __init__(self, path: str, size: int):
        self.path, self.size = path, size
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.buf = self._map
        n_tensors, n_kv = struct.unpack_from("<QQ", self.buf, 8)
        self.fields: dict = {}
        self.alignment = 32
        self._metadata(n_kv, decode=False)
        self._metadata(n_kv, decode=True)
        self.tensors = self._tensor_table([self._tensor_info(i) for i in range(n_tensors)])

    def _metadata(self, n_kv: int, decode: bool) -> None:
        self.off, self.entries, self.decode = 24, 0, decode
        for i in range(n_kv):
            key = self._text(self.string(f"metadata key {i}", 1 << 16), f"metadata key {i}")
            kind = self.u32(f"metadata key {i}'s type")
            value = self.value(kind, f"metadata {key!r}")
            if not decode:
                continue
            if key in self.fields:
                raise ModelLoadError(self.path, f"metadata key {key!r} appears twice")
            self.fields[key] = value
            if key == "general.alignment":
                if kind != UINT32 or value <= 0 or value & (value - 1):
                    raise ModelLoadError(self.path, f"general.alignment {value!r} is not a uint32 power of two")
                self.alignment = value

    def _tensor_table(self, table) -> list[GgufTensor]:
        import gguf

        path, size, start = self.path, self.size, -(-self.off // self.alignment) * self.alignment
        tensors, names = [], set()
        for name, dims, raw, offset in table:
            if name in names:
                raise ModelLoadError(path, "tensor appears twice in the table", name)
            names.add(name)
            try:
                qtype = gguf.GGMLQuantizationType(raw)
                block, type_bytes = gguf.GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise ModelLoadError(path, f"unknown block type {raw}", name) from None
            n = int(np.prod(dims, dtype=object))
            if dims[0] % block:
                raise ModelLoadError(path, f"{qtype.name} rows of {dims[0]} values are not whole {block}-value "
                                           "blocks", name)
            n_bytes, at = n // block * type_bytes, start + offset
            if at + n_bytes > size:
                raise ModelLoadError(path, f"tensor data runs past the end of the file: it ends at byte "
                                           f"{at + n_bytes} of {size} (truncated)", name)
            outer = tuple(reversed(dims))
            dtype = FLOAT_DTYPES.get(qtype.name)
            if dtype is None:  # a block type: raw bytes, a row of blocks per innermost row
                data = np.frombuffer(self._map, np.uint8, n_bytes, at).reshape(outer[:-1] + (-1,))
            else:
                data = np.frombuffer(self._map, dtype, n, at).reshape(outer)
            tensors.append(GgufTensor(name, qtype, tuple(dims), n, n_bytes, at, data))
        return tensors

    def take(self, n: int, what: str) -> int:
        if n > self.size - self.off:
            raise ModelLoadError(self.path, f"{what} of {n} bytes at offset {self.off} runs past the end of the "
                                            f"{self.size}-byte file (corrupt or truncated)")
        start, self.off = self.off, self.off + n
        return start

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def string(self, what: str, cap: int = MAX_STRING_BYTES) -> bytes:
        n = self.u64(f"{what}'s length")
        if n > cap:
            raise ModelLoadError(self.path, f"{what} claims {n} bytes, more than the {cap}-byte cap")
        start = self.take(n, what)
        return self.buf[start:start + min(n, 200 if not self.decode else n)]

    def _text(self, b: bytes, what: str) -> str:
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            if not self.decode:
                return b.decode("utf-8", "replace")  # the first pass names keys; the second refuses them
            raise ModelLoadError(self.path, f"{what} is not UTF-8 text") from None

    def value(self, kind: int, what: str, depth: int = 0):
        out = None
        if kind in SCALAR_FORMATS:
            fmt = SCALAR_FORMATS[kind]
            out = struct.unpack_from(fmt, self.buf, self.take(SCALAR_BYTES[kind], what))[0]
        elif kind == STRING:
            b = self.string(what)
            if self.decode:
                try:
                    out = b.decode("utf-8")
                except UnicodeDecodeError:
                    out = UNREADABLE
        elif kind == ARRAY:
            out = self._array(what, depth)
        else:
            raise ModelLoadError(self.path, f"{what} has unknown value type {kind}")
        if self.off - 24 > MAX_METADATA_BYTES:
            raise ModelLoadError(self.path, f"the metadata passes the {MAX_METADATA_BYTES}-byte cap (at {what})")
        return out

    def _array(self, what: str, depth: int):
        if depth >= MAX_ARRAY_DEPTH:
            raise ModelLoadError(self.path, f"{what} nests arrays more than {MAX_ARRAY_DEPTH} deep")
        item, n = self.u32(f"{what}'s item type"), self.u64(f"{what}'s length")
        least = SCALAR_BYTES.get(item, 8 if item in (STRING, ARRAY) else None)
        if least is None:
            raise ModelLoadError(self.path, f"{what} has items of unknown type {item}")
        if n > MAX_ARRAY_ENTRIES or n * least > self.size - self.off:
            raise ModelLoadError(self.path, f"{what} claims {n} entries, more than the cap of {MAX_ARRAY_ENTRIES} "
                                            f"or the {self.size - self.off} bytes left in the file can hold")
        self.entries += n
        if self.entries > MAX_TOTAL_ENTRIES:
            raise ModelLoadError(self.path, f"the metadata arrays hold more than {MAX_TOTAL_ENTRIES} entries in "
                                            f"all (at {what})")
        if item in SCALAR_DTYPES:
            at = self.take(n * least, what)
            if not self.decode:
                return None
            values = np.frombuffer(self.buf, SCALAR_DTYPES[item], n, at)
            return (values != 0 if item == 7 else values).tolist()
        if item == ARRAY:
            return [self._array(what, depth + 1) for _ in range(n)]
        return self._strings(n, what)

    def _strings(self, n: int, what: str):
        """n strings (the vocabulary's 151,936 tokens and ~151,000 merges): one tight loop, each length checked
        before it is used; bytes are collected only in the decoding pass."""
        buf, off, end, decode = self.buf, self.off, self.size, self.decode
        out = []
        for i in range(n):
            if off + 8 > end:
                self.off = off
                self.take(8, f"{what}[{i}]'s length")
            k = _U64.unpack_from(buf, off)[0]
            off += 8
            if k > MAX_STRING_BYTES or k > end - off:
                self.off = off
                raise ModelLoadError(self.path, f"{what} claims {k} bytes, more than the {MAX_STRING_BYTES}-byte "
                                                f"cap or the {end - off} bytes left in the file (entry {i})")
            if decode:
                out.append(buf[off:off + k])
            off += k
        self.off = off
        if not decode:
            return None
        try:
            return [b.decode("utf-8") for b in out]
        except UnicodeDecodeError:
            return UNREADABLE

    def _tensor_info(self, i: int):
        name = self._text(self.string(f"tensor {i}'s name", 1 << 16), f"tensor {i}'s name")
        n_dims = self.u32(f"tensor {i}'s dimension count")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ModelLoadError(self.path, f"tensor {i} has {n_dims} dimensions (1 to {MAX_DIMS})")
        dims = struct.unpack_from(f"<{n_dims}Q", self.buf, self.take(8 * n_dims, f"tensor {i}'s shape"))
        raw, offset = struct.unpack_from("<IQ", self.buf, self.take(12, f"tensor {i}'s type and offset"))
        return name, dims, raw, offset


FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                "I32": np.int32, "I64": np.int64}


@functools.lru_cache(maxsize=2)
def _open_checked(path: str, _size: int, _mtime_ns: int) -> GgufFile:
    size = _check_header(path)
    try:
        import gguf  # noqa: F401 - the block types and their dequantizers
    except ImportError as e:
        raise ModelLoadError(path, f"reading GGUF files needs the 'gguf' package (pip install gguf): {e}") from None
    return GgufFile(path, size)


def field(reader, key: str, default=None):
    """A metadata value (str, number, bool or list), or `default` when the key is absent or not UTF-8 text."""
    v = reader.fields.get(key, default)
    return default if v is UNREADABLE else v


def _config(reader, path: str) -> ModelConfig:
    arch = field(reader, "general.architecture")
    if arch != "qwen2":
        raise ModelLoadError(path, f"architecture {arch!r} is not qwen2 (this runtime runs Qwen2-family models)")
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ModelLoadError(path, "tensor missing", "token_embd.weight")

    def number(key, kind, default=None):
        v = field(reader, f"qwen2.{key}", default)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and 0 < v <= MAX_INT
        if kind is int:
            ok = ok and float(v).is_integer()
        if not ok:
            raise ModelLoadError(path, f"metadata qwen2.{key} = {v!r} is missing or not a positive {kind.__name__}")
        return kind(v)

    embed_shape = tuple(int(d) for d in tensors["token_embd.weight"].shape)  # ne order: [hidden, vocab]
    cfg = ModelConfig(
        hidden_size=number("embedding_length", int), num_hidden_layers=number("block_count", int),
        num_attention_heads=number("attention.head_count", int),
        num_key_value_heads=number("attention.head_count_kv", int),
        intermediate_size=number("feed_forward_length", int), vocab_size=embed_shape[-1],
        rope_theta=number("rope.freq_base", float, 10000.0),
        rms_norm_eps=number("attention.layer_norm_rms_epsilon", float),
        tie_word_embeddings="output.weight" not in tensors,
        max_position_embeddings=number("context_length", int, 32768))
    cfg.validate(path)
    return cfg


def config_from_gguf(path) -> ModelConfig:
    """The ModelConfig a GGUF file's metadata describes (header and metadata only; no weight is read)."""
    path = str(path)
    return _config(_open(path), path)


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Qwen2 GGUF of this config holds, by llama.cpp name, as [out, in] (rows, columns)."""
    shapes = {"token_embd.weight": (cfg.vocab_size, cfg.hidden_size), "output_norm.weight": (cfg.hidden_size,)}
    if not cfg.tie_word_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, cfg.hidden_size)
    ls = layer_shapes(cfg)
    for i in range(cfg.num_hidden_layers):
        for short, name in GGUF_LAYER.items():
            shapes[f"blk.{i}.{name}"] = ls[short]
    return shapes


# Values dequantized at once. The row kernels of gguf.quants (`dequantize_rows`, what gguf.quants.dequantize runs on
# groups of 16 rows) are called on ~64 K values: their temporaries stay in the cache, and the whole 0.5B file takes
# ~1.7x less time than gguf.quants.dequantize on each tensor (1.28 s against 2.2 s for two layers and the embedding,
# this 2-core host), with the same values (test_gguf).
DEQUANT_BLOCK_ELEMENTS = 1 << 16


def _dequantize(path: str, t, keep_f32: bool) -> np.ndarray:
    """One tensor as bf16 bits (float32 with keep_f32), [out, in], dequantized a block of rows at a time, so a
    151,936-row embedding never has tensor-sized float32 temporaries."""
    import gguf

    kind = t.tensor_type.name
    if kind not in SUPPORTED_TYPES:
        raise ModelLoadError(path, f"block type {kind} is not supported (supported: {', '.join(SUPPORTED_TYPES)})",
                             t.name)
    rows = [int(d) for d in reversed(t.shape)]
    data = np.asarray(t.data)
    out = np.empty(rows, np.float32 if keep_f32 else np.uint16)
    flat = out.reshape(rows[0], -1) if len(rows) > 1 else out.reshape(1, -1)
    # rows of the stored data: [rows, bytes of a row] (a block type) or [rows, columns] (floats)
    blockwise = len(rows) == 2 and data.ndim == 2 and data.shape[0] == rows[0]
    step = max(1, DEQUANT_BLOCK_ELEMENTS // max(1, flat.shape[1])) if blockwise else flat.shape[0]
    rows_of = getattr(gguf.quants, kind).dequantize_rows if kind not in ("F32", "F16") else None
    for r in range(0, flat.shape[0], step):
        part = data[r:r + step] if blockwise else data
        try:
            f = np.asarray(part, np.float32) if rows_of is None else rows_of(part)
        except (ValueError, NotImplementedError, TypeError) as e:
            raise ModelLoadError(path, f"cannot dequantize {kind} ({type(e).__name__}: {e})", t.name) from None
        f = f.reshape(-1, flat.shape[1])
        if not np.isfinite(f).all():
            raise ModelLoadError(path, "contains NaN or Inf", t.name)
        flat[r:r + f.shape[0]] = f if keep_f32 else f32_to_bf16(f)
    release_pages(t.data)  # read once: the file's pages need not stay in this process (0.49 GB for the 0.5B)
    return out


def hf_tensors(path, keep_f32: bool = False):
    """A GGUF file's transformer tensors under their HF names, checked before any is read: (config, specs
    [(HF name, "BF16" | "F32", shape)], an iterator that dequantizes each tensor of `specs` in turn). One tensor is
    in memory at a time (the converted-weights cache streams them to disk)."""
    path = str(path)
    if not os.path.isfile(path):
        raise ModelLoadError(path, "GGUF file not found")
    reader = _open(path)
    cfg = _config(reader, path)
    tensors = {t.name: t for t in reader.tensors}
    want = expected_shapes(cfg)
    layers_held = {int(n.split(".")[1]) for n in tensors if n.startswith("blk.") and n.split(".")[1].isdigit()}
    if layers_held and max(layers_held) + 1 != cfg.num_hidden_layers:
        raise ModelLoadError(path, f"qwen2.block_count={cfg.num_hidden_layers} but the file holds "
                                   f"{max(layers_held) + 1} layers")
    for name, shape in want.items():
        if name not in tensors:
            raise ModelLoadError(path, "tensor missing", name)
        got = tuple(int(d) for d in reversed(tensors[name].shape))
        if got != shape:
            raise ModelLoadError(path, f"shape {list(got)} does not match the metadata, expected {list(shape)}", name)
    for name, t in tensors.items():  # every block type named up front, before minutes of dequantizing
        if name in want and t.tensor_type.name not in SUPPORTED_TYPES:
            raise ModelLoadError(path, f"block type {t.tensor_type.name} is not supported (supported: "
                                       f"{', '.join(SUPPORTED_TYPES)})", name)
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    if not cfg.tie_word_embeddings:
        names["output.weight"] = "lm_head.weight"
    for i in range(cfg.num_hidden_layers):
        for short, name in GGUF_LAYER.items():
            names[f"blk.{i}.{name}"] = f"model.layers.{i}.{LAYER_TENSORS[short]}"
    dtype = "F32" if keep_f32 else "BF16"
    specs = [(hf, dtype, want[g]) for g, hf in names.items()]
    return cfg, specs, (_dequantize(path, tensors[g], keep_f32) for g in names)


def load_gguf(path, keep_f32: bool = False):
    """A GGUF file as `Weights` (bf16 bits; float32 arrays with keep_f32), every tensor checked, all in memory
    (the converted-weights cache's fallback, and keep_f32's fidelity measurements)."""
    path = str(path)
    cfg, specs, arrays = hf_tensors(path, keep_f32)
    t = {name: arr for (name, _, _), arr in zip(specs, arrays)}
    return weights_from_hf(cfg, t, path, [path], vision_path(path))


def vision_path(path: str) -> str:
    """The vision projector that goes with a GGUF file: `model.gguf` -> `model.vision.safetensors` beside it."""
    stem = path[:-5] if path.lower().endswith(".gguf") else path
    return stem + ".vision.safetensors"


def block_type_counts(path) -> dict[str, int]:
    """{block type: tensor count} of a GGUF file (for reports)."""
    counts: dict[str, int] = {}
    for t in _open(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


def save_gguf(path, weights: Weights, linear_type: str = "Q8_0", embed_type: str = "F16", arch: str = "qwen2",
              chat_template: str | None = None, control_tokens=(), tokenizer_meta: dict | None = None) -> str:
    """Write `weights` as a Qwen2 GGUF file as llama.cpp's converter lays it out (tests, random-weight GGUFs):
    metadata under `qwen2.*`, the decoder linears in `linear_type`, token embedding and an untied output in
    `embed_type` (any type gguf.quants quantizes: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, TQ1_0, ...),
    norms and biases F32, and a stand-in byte-level vocabulary (the 256 byte tokens, then `<|vla_N|>` fillers) so
    readers that size the vocabulary from it load the file. A layer tensor missing from `weights` is left out, and
    `arch` names another architecture (both for the tests of refused files). `chat_template` is stored as
    `tokenizer.chat_template`; `control_tokens` take the first filler ids as control (special) tokens;
    `tokenizer_meta` ({"tokens" | "token_type" | "merges": list, or None to leave the key out}) replaces the
    vocabulary's arrays (the tests of tokenizers that do not fit the model)."""
    import gguf

    from .quant import as_f32

    cfg = weights.cfg
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("vla_edge_ros random qwen2")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    byte_tokens = [c for _, c in sorted(_bytes_to_unicode().items())]
    fillers = list(control_tokens) + [f"<|vla_{i}|>" for i in range(cfg.vocab_size - len(byte_tokens))]
    tokens = (byte_tokens + fillers)[:cfg.vocab_size]
    types = [1] * len(byte_tokens) + [3] * len(control_tokens) + [1] * cfg.vocab_size
    arrays = {"tokens": tokens, "token_type": types[:cfg.vocab_size], "merges": []}
    arrays.update(tokenizer_meta or {})
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    for key, values in arrays.items():
        if values is not None:
            w.add_array(f"tokenizer.ggml.{key}", values)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def put(name, arr, kind):
        f = np.ascontiguousarray(as_f32(arr), np.float32)
        if kind == "F32":
            w.add_tensor(name, f)
        elif kind == "F16":
            w.add_tensor(name, f.astype(np.float16))
        else:
            qtype = gguf.GGMLQuantizationType[kind]
            w.add_tensor(name, gguf.quants.quantize(f, qtype), raw_dtype=qtype)

    put("token_embd.weight", weights.embed, embed_type)
    put("output_norm.weight", weights.norm, "F32")
    if weights.lm_head is not None:
        put("output.weight", weights.lm_head, embed_type)
    for i, layer in enumerate(weights.layers):
        for short, name in GGUF_LAYER.items():
            if short in layer:
                put(f"blk.{i}.{name}", layer[short], linear_type if layer[short].ndim == 2 else "F32")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE vocabularies are spelled in it)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))
