# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""dev/ stays runnable (DESIGN.md §12): its CUDA variants still compile against today's kernels/common.cuh, its
Python and shell scripts still parse, and every mutant in dev/mutants still applies to the tree it was made for
(scripts/mutation_check.sh runs them; that takes minutes and is not part of CI)."""
from __future__ import annotations

import glob
import os
import py_compile
import subprocess

import pytest

from test_kernels_compile import NVRTC, compile_source

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEV = os.path.join(ROOT, "dev")
CU = sorted(glob.glob(os.path.join(DEV, "**", "*.cu"), recursive=True))
PY = sorted(glob.glob(os.path.join(DEV, "**", "*.py"), recursive=True))
SH = sorted(glob.glob(os.path.join(DEV, "**", "*.sh"), recursive=True))
PATCHES = sorted(glob.glob(os.path.join(DEV, "mutants", "*.patch")))
# files of templates only: the instances that must still compile (decode_persistent.cu: the 1.5B shape, both formats,
# as dev/cuda/decode_micro.py's decode_instance names them)
TEMPLATE_INSTANCES = {"decode_persistent.cu": ("decode_pass<Bf16W, 128, 6, true, 3, true, 7, true>",
                                               "decode_pass<Q4W, 128, 6, true, 3, true, 5, true>")}


@pytest.mark.skipif(NVRTC is None, reason="cuda-python / nvidia-cuda-nvrtc / nvidia-cuda-runtime not installed")
@pytest.mark.parametrize("path", CU, ids=[os.path.relpath(p, DEV) for p in CU])
def test_dev_kernels_compile(path):
    compile_source(path, "sm_90", names=TEMPLATE_INSTANCES.get(os.path.basename(path), ()))


@pytest.mark.parametrize("path", PY + SH, ids=[os.path.relpath(p, DEV) for p in PY + SH])
def test_dev_scripts_parse(path, tmp_path):
    if path.endswith(".py"):
        py_compile.compile(path, cfile=str(tmp_path / "x.pyc"), doraise=True)
    else:
        r = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("path", PATCHES, ids=[os.path.basename(p) for p in PATCHES])
def test_every_mutant_still_applies_and_names_its_tests(path):
    head = open(path).readline()
    assert head.startswith("# tests: "), head
    for test in head[len("# tests: "):].split():
        assert os.path.isfile(os.path.join(ROOT, test.split("::")[0])), test
    r = subprocess.run(["git", "apply", "--check", path], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
