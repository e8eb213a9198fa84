# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Put the two-line copyright / SPDX header on every source file that lacks it (test/test_copyright.py checks).

Run ``python3 scripts/add_license_headers.py``: it edits in place and prints what changed.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOLDER = "Copyright 2026 vla_edge_ros maintainers"
SPDX = "SPDX-License-Identifier: Apache-2.0"
COMMENT = {".py": "#", ".sh": "#", ".yaml": "#", ".cu": "//", ".cuh": "//"}
# what carries the header: the package, its tests, launch files, scripts, kernels and the dev / bench tools
GLOBS = ("vla_edge_ros/**/*.py", "test/**/*.py", "launch/*.py", "launch/*.yaml", "scripts/*.py", "scripts/*.sh",
         "kernels/*.cu", "kernels/*.cuh", "dev/**/*.py", "dev/**/*.cu", "dev/**/*.sh", "bench/**/*.py",
         "bench/**/*.sh", "setup.py", ".ci/*")


def source_files() -> list[Path]:
    out = set()
    for g in GLOBS:
        out.update(p for p in ROOT.glob(g) if p.is_file() and (p.suffix in COMMENT or p.parent.name == ".ci"))
    return sorted(out)


def header(path: Path) -> list[str]:
    c = COMMENT.get(path.suffix, "#")
    return [f"{c} {HOLDER}\n", f"{c} {SPDX}\n"]


def has_header(lines: list[str]) -> bool:
    head = "".join(lines[:4])
    return HOLDER in head and SPDX in head


def fix(path: Path) -> bool:
    lines = path.read_text().splitlines(keepends=True)
    if has_header(lines):
        return False
    keep = 1 if lines and lines[0].startswith("#!") else 0
    # an SPDX line alone (written before this script) is replaced by the full header
    rest = [ln for ln in lines[keep:keep + 2] if SPDX not in ln] + lines[keep + 2:]
    path.write_text("".join(lines[:keep] + header(path) + rest))
    return True


if __name__ == "__main__":
    changed = [p for p in source_files() if fix(p)]
    for p in changed:
        print(p.relative_to(ROOT))
    print(f"{len(changed)} files given the header", file=sys.stderr)
