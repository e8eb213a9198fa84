# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""A small reader/writer of the safetensors format that keeps bf16 as raw uint16 bits.

NumPy has no bfloat16, and the `safetensors` package refuses BF16 for its numpy frontend, so the
format is read here directly: an 8-byte little-endian header length, a JSON header, then raw
little-endian tensor bytes. Reading never executes anything from the file (no pickle) and every
malformed case raises `ModelLoadError` naming the file and the tensor.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np

# dtype name in the header -> (numpy dtype used to hold it, bytes per element)
DTYPES = {
    "BF16": (np.dtype("<u2"), 2),
    "F16": (np.dtype("<f2"), 2),
    "F32": (np.dtype("<f4"), 4),
    "F64": (np.dtype("<f8"), 8),
    "I64": (np.dtype("<i8"), 8),
    "I32": (np.dtype("<i4"), 4),
    "I16": (np.dtype("<i2"), 2),
    "I8": (np.dtype("i1"), 1),
    "U8": (np.dtype("u1"), 1),
    "BOOL": (np.dtype("?"), 1),
}
MAX_HEADER_BYTES = 100 * 1024 * 1024


class ModelLoadError(Exception):
    """A model file is missing, truncated or inconsistent. The message names the file and tensor."""

    def __init__(self, path, message, tensor=None):
        self.path = str(path)
        self.tensor = tensor
        where = f"{self.path}" + (f" [tensor '{tensor}']" if tensor else "")
        super().__init__(f"{where}: {message}")


class TensorInfo:
    __slots__ = ("name", "dtype", "shape", "start", "end")

    def __init__(self, name, dtype, shape, start, end):
        self.name, self.dtype, self.shape, self.start, self.end = name, dtype, tuple(shape), start, end


def read_header(path) -> tuple[dict[str, TensorInfo], dict, int]:
    """Parse and validate the header: returns ({name: TensorInfo}, metadata, data_offset)."""
    if not os.path.isfile(path):
        raise ModelLoadError(path, "file not found")
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ModelLoadError(path, f"truncated: {size} bytes, no safetensors header")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise ModelLoadError(path, f"header length {n} does not fit the file ({size} bytes): truncated or not "
                                           f"safetensors")
            try:
                header = json.loads(f.read(n).decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
                raise ModelLoadError(path, f"header is not valid JSON ({type(e).__name__}: {e})") from None
    except OSError as e:  # PermissionError, EIO, ...: one line naming the file
        raise ModelLoadError(path, f"cannot read ({type(e).__name__}: {e.strerror or e})") from None
    if not isinstance(header, dict):
        raise ModelLoadError(path, "header is not a JSON object")
    data_offset = 8 + n
    data_bytes = size - data_offset
    metadata = header.pop("__metadata__", {}) or {}
    infos = {}
    for name, h in header.items():
        try:
            dtype, shape, (start, end) = h["dtype"], h["shape"], h["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ModelLoadError(path, "header entry lacks dtype/shape/data_offsets", name) from None
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise ModelLoadError(path, f"unsupported dtype {dtype!r}", name)
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape) \
                or not (_is_count(start) and _is_count(end)):
            raise ModelLoadError(path, f"shape {shape!r} / data_offsets {h['data_offsets']!r} are not "
                                       f"non-negative integers", name)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - start != count * DTYPES[dtype][1] or start < 0:
            raise ModelLoadError(path, f"data_offsets {start}..{end} do not match shape {shape} of {dtype}", name)
        if end > data_bytes:
            raise ModelLoadError(path, f"truncated: tensor needs bytes up to {end}, file has {data_bytes} data bytes",
                                 name)
        infos[name] = TensorInfo(name, dtype, shape, start, end)
    return infos, metadata, data_offset


def _is_count(x) -> bool:
    """A non-negative JSON integer (not a bool, float or string) small enough for int64 offsets."""
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < (1 << 62)


def load_file(path, names=None, mmap=True) -> dict[str, tuple[str, np.ndarray]]:
    """Load tensors as {name: (dtype_name, array)}. BF16 arrives as uint16 bits."""
    infos, _, offset = read_header(path)
    wanted = infos.keys() if names is None else names
    out = {}
    try:
        mm = np.memmap(path, dtype=np.uint8, mode="r") if mmap else np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise ModelLoadError(path, f"cannot read ({type(e).__name__}: {e.strerror or e})") from None
    for name in wanted:
        if name not in infos:
            raise ModelLoadError(path, "tensor missing", name)
        t = infos[name]
        npdt = DTYPES[t.dtype][0]
        arr = mm[offset + t.start: offset + t.end].view(npdt).reshape(t.shape)
        out[name] = (t.dtype, arr)
    return out


def save_file(tensors: dict[str, tuple[str, np.ndarray]], path, metadata: dict | None = None) -> None:
    """Write {name: (dtype_name, array)}; BF16 arrays are given as uint16 bits."""
    for name, (dtype, arr) in tensors.items():
        if arr.dtype.itemsize != DTYPES[dtype][1]:
            raise ValueError(f"tensor {name}: array dtype {arr.dtype} cannot hold {dtype}")
    specs = [(name, dtype, arr.shape) for name, (dtype, arr) in sorted(tensors.items())]
    write_tensors(path, specs, (tensors[name][1] for name, _, _ in specs), metadata)


def write_tensors(path, specs, arrays, metadata: dict | None = None, durable: bool = True) -> None:
    """Write a safetensors file from `specs` [(name, dtype_name, shape)] and `arrays`, an iterable that yields each
    tensor's array in the same order: the header is known from the shapes, so one tensor at a time is in memory
    (the converted-weights cache streams a whole model through here). Written beside `path` and renamed: a crash
    mid-write never leaves a half file behind. `durable`: fsync'd before the rename (off where a reader checks the
    content anyway: the converted-weights cache hashes its entries at every start; 1.7 s of the 0.5B's first start)."""
    header, pos = {}, 0
    for name, dtype, shape in specs:
        nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype][1] if shape else DTYPES[dtype][1]
        header[name] = {"dtype": dtype, "shape": [int(d) for d in shape], "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    header["__metadata__"] = {"format": "pt", **(metadata or {})}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format asks for 8-byte alignment of the data
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for (name, dtype, shape), arr in zip(specs, arrays):
                arr = np.ascontiguousarray(arr)
                if tuple(arr.shape) != tuple(shape) or arr.dtype.itemsize != DTYPES[dtype][1]:
                    raise ValueError(f"tensor {name}: array {arr.dtype} {list(arr.shape)} is not the {dtype} "
                                     f"{list(shape)} the header says")
                f.write(np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<"), copy=False)).data)  # no copy
            if f.tell() != 8 + len(blob) + pos:
                raise ValueError(f"{path}: fewer tensors than the header names")
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def release_pages(arr) -> None:
    """Drop the resident pages of `arr` from this process when it is a view of a read-only memory map (a
    safetensors file opened by load_file, a GGUF's tensor data): they stay in the page cache, and a later read
    faults them back in.
    The golden model and the CUDA upload read a whole memory-mapped model once; without this those pages would
    count in the process's memory as long as the map lives. Anything else (an array in memory): no-op."""
    import mmap

    base = arr
    while base is not None and not isinstance(base, (np.memmap, mmap.mmap)):
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    mm = base if isinstance(base, mmap.mmap) else getattr(base, "_mmap", None)
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    try:
        start = arr.__array_interface__["data"][0] - np.frombuffer(mm, np.uint8, count=1).__array_interface__["data"][0]
    except (ValueError, TypeError):  # a closed or empty map
        return
    page = mmap.PAGESIZE
    first, last = -(-start // page) * page, (start + arr.nbytes) // page * page
    if 0 <= first < last <= len(mm):  # whole pages only: a page shared with a neighbour stays
        try:
            mm.madvise(mmap.MADV_DONTNEED, first, last - first)
        except (OSError, ValueError):
            pass


def release_heap() -> None:
    """Hand freed heap memory back to the system (glibc's malloc_trim; elsewhere a no-op). Arrays of a few MB come
    from the heap, not from maps of their own, and glibc keeps what they leave when they are freed: a 4-bit 0.5B's
    repacked layers, dropped after the upload, still counted 167 MB of RSS until trimmed."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest even), returned as uint16 bits. NaN stays NaN. One uint32 temporary, updated
    in place (3x faster than an expression that allocates at each step)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    t = u >> 16
    t &= 1
    t += 0x7FFF
    t += u  # uint32 wraps: only a NaN's bits can carry out, and NaN is set below
    t >>= 16
    rounded = t.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = 0x7FC0
    return rounded


def bf16_to_f32(b: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) widened to float32, exactly. Shifted in place: one float32-sized array, no second one (the
    0.5B's untied head widens to 545 MB; a temporary of that size set the golden model's peak RSS)."""
    u = np.asarray(b, dtype=np.uint16).astype(np.uint32)
    u <<= 16
    return u.view(np.float32)
