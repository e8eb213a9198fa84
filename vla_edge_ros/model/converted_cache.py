# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The converted-weights cache: a GGUF model converted once, memory-mapped at every later start.

Opening a GGUF reads ~450,000 metadata entries, rebuilds its byte-level BPE tokenizer from them and dequantizes
every tensor to bf16: ~15 s on a 2-core host for the 491 MB Qwen2.5-0.5B file. The first load writes the
result as an HF-layout model directory, an *entry*: `model.safetensors` (bf16), `config.json` (the GGUF's metadata),
`tokenizer.json` and `tokenizer_config.json` (chat template, bos / eos) when the file has a tokenizer. Later starts
load that directory (the weights memory-mapped) and never open the GGUF reader. The vision sidecar
(`model.vision.safetensors`) is read from beside the GGUF as before; it is not converted.

Where: `$VLA_EDGE_CONVERTED_CACHE`, else `converted/` in the folder of the generated assets (`vla_edge_ros.cache`:
`$VLA_EDGE_CACHE`, else `out/cache` of a writable source tree, else `$XDG_CACHE_HOME` or `~/.cache` + `/vla_edge_ros`).
`VLA_EDGE_CONVERTED_CACHE=off` converts in memory at every start. Clearing it is deleting the folder.

An entry's folder is named by its key: the GGUF's content hash, size and modification time (ns). The hash is
XXH3-128 (the `xxhash` package): it guards against damage, not against an attacker who can write the cache folder,
and it reads ~4 GB/s here where sha256 reads 0.5-1 GB/s (the 0.5B's 491 MB file and its 1.2 GB entry are hashed at
every start: 0.35 s against 1.6-3.7 s with sha256 on this 2-core host). `entry.json` records the source and the
size and hash of every file of the entry; the folder is written under a temporary name and renamed whole, so a
half-written entry has no name to be found by. A lookup checks every recorded size and hash: an entry that is
truncated, changed, half-written or holds a foreign file under a right name is removed and rebuilt, never trusted.
A folder that cannot be written gets one WARN and the model is converted in memory. Writing an entry removes the
entries of files that no longer exist or that were another version of the same path.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from .safetensors_io import write_tensors

log = logging.getLogger(__name__)

CACHE_ENV = "VLA_EDGE_CONVERTED_CACHE"
FORMAT = 2  # bumped when an entry's layout or contents change: entries of another format are rebuilt
ENTRY = "entry.json"
WEIGHTS = "model.safetensors"
HASH_BLOCK = 1 << 20  # read into one buffer: hashing allocates nothing per block

_checked: dict = {}  # (source identity, entry.json's mtime) -> entry folder: each entry is hashed once a process
_warned: set = set()  # cache folders already warned about as unwritable


def cache_root() -> Path | None:
    """The cache folder (not created here), or None when the cache is off."""
    env = os.environ.get(CACHE_ENV)
    if env is not None and env.strip().lower() in ("off", "0", "none", "false"):
        return None
    if env:
        return Path(env).expanduser()
    from ..cache import cache_root as assets_root

    return assets_root() / "converted"


def file_hash(path) -> str:
    """XXH3-128 of the file's bytes, 32 hex digits."""
    import xxhash

    h = xxhash.xxh3_128()
    buf = bytearray(HASH_BLOCK)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _identity(path: str) -> tuple[str, int, int]:
    st = os.stat(path)
    return os.path.realpath(path), st.st_size, st.st_mtime_ns


_keys: dict = {}  # (realpath, size, mtime) -> key: a file is hashed once a process while unchanged


def source_key(path: str) -> str:
    """The entry name of the GGUF at `path`: the hash of its content, its size and its modification time."""
    ident = _identity(path)
    if ident not in _keys:
        _keys.clear()
        _keys[ident] = f"{file_hash(path)}-{ident[1]}-{ident[2]}"
    return _keys[ident]


def lookup(path) -> str | None:
    """The folder of a valid entry for the GGUF at `path`, or None (cache off, no entry, or one that failed its
    checks, which is removed)."""
    root = cache_root()
    if root is None:
        return None
    path = str(path)
    try:
        _, size, mtime = _identity(path)
        # no entry of this size and time: nothing to hash the file for (a first start, a hostile file)
        if not any(n.endswith(f"-{size}-{mtime}") for n in os.listdir(root)):
            return None
        key = source_key(path)
    except OSError:
        return None
    entry = root / key
    try:
        stamp = (entry / ENTRY).stat().st_mtime_ns
    except OSError:
        if entry.is_dir():  # a folder of the entry's name without its record: never completed
            log.warning("converted-weights cache: %s has no %s; converting the model again", entry, ENTRY)
            shutil.rmtree(entry, ignore_errors=True)
        return None
    memo = (key, str(entry), stamp)
    if memo in _checked:
        return _checked[memo]
    why = _problem(entry, key)
    if why:
        log.warning("converted-weights cache: %s: %s; converting the model again", entry, why)
        shutil.rmtree(entry, ignore_errors=True)
        return None
    _checked[memo] = str(entry)
    return str(entry)


def _problem(entry: Path, key: str) -> str | None:
    """Why the entry cannot be used, or None."""
    try:
        meta = json.loads((entry / ENTRY).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        return f"{ENTRY} unreadable ({type(e).__name__})"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("key") != key:
        return f"{ENTRY} is of another format or another file"
    files = meta.get("files")
    if not isinstance(files, dict) or WEIGHTS not in files:
        return f"{ENTRY} lists no {WEIGHTS}"
    for name, want in files.items():
        p = entry / name
        if not isinstance(want, dict) or os.path.basename(name) != name:
            return f"{ENTRY} has a bad file record {name!r}"
        try:
            size = p.stat().st_size
        except OSError:
            return f"{name} missing"
        if size != want.get("size"):
            return f"{name} is {size} bytes, {want.get('size')} were written (truncated or replaced)"
        if file_hash(p) != want.get("xxh3_128"):
            return f"{name} does not hold what was written (its hash differs)"
    return None


def store(path, specs, arrays, files: dict[str, bytes]) -> str | None:
    """Write the entry of the GGUF at `path`: `specs` / `arrays` (safetensors_io.write_tensors' arguments: the
    transformer's tensors under their HF names, one at a time) as model.safetensors, and `files` ({name: bytes}:
    config.json, the tokenizer's files). Returns the entry's folder, or None when the cache is off or cannot be
    written (one WARN a folder). A writer that loses a race to another process for the same entry uses theirs."""
    root = cache_root()
    if root is None:
        return None
    path = str(path)
    key = source_key(path)
    entry = root / key
    tmp = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        write_tensors(tmp / WEIGHTS, specs, arrays, durable=False)  # hashed at every start: no fsync needed
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        records = {p.name: {"size": p.stat().st_size, "xxh3_128": file_hash(p)} for p in sorted(tmp.iterdir())}
        meta = {"format": FORMAT, "key": key, "source": os.path.realpath(path), "files": records}
        (tmp / ENTRY).write_text(json.dumps(meta, indent=1), encoding="utf-8")
        _prune(root, os.path.realpath(path), key)
        try:
            os.rename(tmp, entry)
            tmp = None
        except OSError:
            if not (entry / ENTRY).is_file():  # not a lost race: an empty or broken folder of that name
                raise
    except OSError as e:
        if str(root) not in _warned:
            _warned.add(str(root))
            log.warning("converted-weights cache %s cannot be written (%s: %s): the model is converted in memory at "
                        "every start (%s names another folder)", root, type(e).__name__, e.strerror or e, CACHE_ENV)
        return None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(entry)


def _prune(root: Path, source: str, key: str) -> None:
    """Remove the entries of files that are gone and of other versions of `source`."""
    for d in root.iterdir():
        if d.name.startswith(".") or d.name == key or not d.is_dir():
            continue
        try:
            src = json.loads((d / ENTRY).read_text(encoding="utf-8")).get("source")
        except (OSError, ValueError, AttributeError, RecursionError):
            continue  # not an entry of this cache: left alone
        if src == source or not (isinstance(src, str) and os.path.exists(src)):
            shutil.rmtree(d, ignore_errors=True)
