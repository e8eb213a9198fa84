# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Every kernels/*.cu compiles with NVRTC for sm_80 (Ampere), sm_87 (Orin) and sm_90 (Hopper).

CI has no GPU: this uses `cuda.bindings.nvrtc` (pip: cuda-python, nvidia-cuda-nvrtc,
nvidia-cuda-runtime for cuda_bf16.h). Skips only when those packages are absent.
"""
import glob
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
KDIR = os.path.join(os.path.dirname(HERE), "kernels")
SOURCES = sorted(glob.glob(os.path.join(KDIR, "*.cu")))
ARCHS = ["sm_80", "sm_87", "sm_90"]


def _nvrtc_and_include():
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return None, None
    try:
        import nvidia
    except ImportError:
        return None, None
    for base in list(getattr(nvidia, "__path__", [])):
        for sub in ("cu13/include", "cuda_runtime/include", "cu12/include"):
            inc = os.path.join(base, sub)
            if os.path.isfile(os.path.join(inc, "cuda_bf16.h")):
                return nvrtc, inc
    return None, None


NVRTC, INCLUDE = _nvrtc_and_include()


def compile_source(path: str, arch: str, extra=(), want_ptx=False, names=()):
    """Compile one .cu to PTX; returns the log (and the PTX with want_ptx); raises AssertionError with the log on
    failure. ``names``: template instances to compile (NVRTC name expressions)."""
    nvrtc = NVRTC
    with open(path, "rb") as f:
        src = f.read()
    err, prog = nvrtc.nvrtcCreateProgram(src, os.path.basename(path).encode(), 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    for name in names:
        (err,) = nvrtc.nvrtcAddNameExpression(prog, name.encode())
        assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, (name, err)
    opts = [f"--gpu-architecture={arch}".encode(), b"-default-device", b"-std=c++17",
            f"-I{INCLUDE}".encode(), f"-I{KDIR}".encode()] + [e.encode() for e in extra]
    (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    # NVRTC writes into the buffer: it must be a fresh mutable one. (`b" " * 1` is CPython's shared
    # one-byte object: writing a NUL into it once turned every b" " in the process into b"\x00".)
    log = bytearray(size)
    nvrtc.nvrtcGetProgramLog(prog, log)
    log = bytes(log).decode(errors="replace").rstrip("\x00 ")
    ptx = b""
    if res == nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, psize = nvrtc.nvrtcGetPTXSize(prog)
        assert psize > 0
        if want_ptx:
            ptx = bytearray(psize)
            nvrtc.nvrtcGetPTX(prog, ptx)
            ptx = bytes(ptx)
    nvrtc.nvrtcDestroyProgram(prog)
    assert res == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"{os.path.basename(path)} for {arch}:\n{log}"
    return (log, ptx.decode(errors="replace")) if want_ptx else log


def test_kernel_sources_exist():
    names = {os.path.basename(p) for p in SOURCES}
    for required in ("embedding.cu", "rmsnorm.cu", "gemv.cu", "gemm.cu", "attention.cu", "lm_head.cu",
                     "vision.cu", "kv_write.cu", "timer.cu"):
        assert required in names


def test_every_kernel_file_has_a_numpy_twin_named():
    """One op family per file, each header naming the NumPy twin its GPU test checks it against."""
    for path in SOURCES:
        with open(path) as f:
            head = f.read(3000)
        assert "Twin" in head or "twin" in head, f"{os.path.basename(path)} names no NumPy twin"


@pytest.mark.skipif(NVRTC is None, reason="cuda-python / nvidia-cuda-nvrtc / nvidia-cuda-runtime not installed")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", SOURCES, ids=[os.path.basename(p) for p in SOURCES])
def test_compiles(path, arch):
    """Each source compiles, once an architecture, as the backend builds it (cuda/kernels.py: -DVLA_PDL): without
    warnings; griddepcontrol (PDL_WAIT) in every kernel on sm_90, none below (Hopper only)."""
    log, ptx = compile_source(path, arch, extra=("-DVLA_PDL",), want_ptx=True)
    assert "warning" not in log.lower() or "declared but never referenced" in log, log
    n_entries = ptx.count(".entry ")
    assert n_entries > 0
    if arch == "sm_90":
        assert ptx.count("griddepcontrol.wait") >= n_entries, "a kernel without PDL_WAIT"
    else:
        assert "griddepcontrol" not in ptx


def _launch_py_names(*names):
    """Module-level assignments and functions of cuda/launch.py, executed alone (launch.py itself imports CuPy)."""
    import ast

    with open(os.path.join(os.path.dirname(HERE), "vla_edge_ros", "cuda", "launch.py")) as f:
        tree = ast.parse(f.read())
    keep = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name in names)
            or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) in names for t in n.targets))]
    ns = {}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "launch.py", "exec"), ns)
    return ns


def test_gemm_launcher_config_matches_the_kernel_defaults():
    """cuda/launch.py GEMM_CFG (block rows, warp groups along K, stages: the launcher's grid and shared memory)
    is what kernels/gemm.cu compiles by default (read from the sources: no CuPy needed)."""
    import re

    with open(os.path.join(KDIR, "gemm.cu")) as f:
        defaults = {m.group(1): int(m.group(2)) for m in re.finditer(r"#define (GEMM_\w+) (\d+)", f.read())}
    ns = _launch_py_names("GEMM_CFG", "GEMM_ROWS", "gemm_smem_bytes", "gemm_block_rows", "gemm_kernel_rows")
    cfg = ns["GEMM_CFG"]
    b, w = cfg["bf16"], cfg["w4"]
    assert cfg["f16"] == b  # the same body on fp16 weights
    assert (b["nt"], b["kw"], b["stages"]) == (defaults["GEMM_NT_BF16"], defaults["GEMM_KW_BF16"],
                                               defaults["GEMM_STAGES_BF16"])
    assert (w["nw"], w["kw"], w["stages"]) == (defaults["GEMM_NW_W4"], defaults["GEMM_KW_W4"],
                                               defaults["GEMM_STAGES_W4"])
    assert ns["gemm_block_rows"]("w4") == 64 * defaults["GEMM_NW_W4"]  # W4::NB
    assert ns["GEMM_ROWS"] == (32, 48, 96)
    for fmt in ("bf16", "f16", "w4"):
        for rows in ns["GEMM_ROWS"]:  # one block's dynamic shared memory (launch.gemm_smem_bytes) fits sm_90's 227 KB
            assert ns["gemm_smem_bytes"](fmt, rows) <= 227 * 1024
    # the instances the launcher names exist in the source
    with open(os.path.join(KDIR, "gemm.cu")) as f:
        src = f.read()
    for fmt in ("bf16", "f16", "w4"):
        for rows in ns["GEMM_ROWS"]:
            t = ns["gemm_kernel_rows"](fmt, rows)
            assert re.search(rf"^GEMM_{'W4' if fmt == 'w4' else 'BF16'}\(\d+, {t}[,)]", src, re.M), (fmt, t)
    assert "gemm_f16_t##T(" in src and "gemm_w4h_t##T(" in src  # the fp16 instances of each macro


def test_gemv_launcher_plan_matches_the_kernel_defaults():
    """cuda/launch.py GEMV_RB / GEMV_STAGES are what kernels/gemv.cu compiles by default (rows a warp takes per
    iteration, ring stages; gemv.cuh's defaults): the launcher's grid and shared memory depend on them."""
    import re

    with open(os.path.join(KDIR, "gemv.cuh")) as f:
        d = {m.group(1): int(m.group(2)) for m in re.finditer(r"#define (GV_\w+) (\d+)", f.read())}
    ns = _launch_py_names("GEMV_RB", "GEMV_STAGES")
    assert ns["GEMV_RB"]["w4"] == {"qkv": d["GV_RB_W4_QKV"], "gateup": d["GV_RB_W4_PAIRS"], "proj": d["GV_RB_W4_PROJ"]}
    assert ns["GEMV_RB"]["bf16"] == ns["GEMV_RB"]["f16"] == {"qkv": 1, "gateup": 1, "proj": 1}  # W16's RB_*
    assert ns["GEMV_STAGES"] == {"bf16": d["GV_NS_BF16"], "f16": d["GV_NS_BF16"], "w4": d["GV_NS_W4"]}


@pytest.mark.skipif(NVRTC is None, reason="cuda-python / nvidia-cuda-nvrtc / nvidia-cuda-runtime not installed")
def test_gemv_shared_memory_the_launcher_passes_is_the_kernels_ring(tmp_path):
    """launch.gemv_smem_bytes (the dynamic shared memory every GEMV launch asks for) equals the ring gemv.cu lays out
    (GV_WARPS x NS x GvRing::kSlot) for every instance: a smaller allocation would let cp.async write past it.
    Checked by the compiler: static_asserts over the kernel's own templates, compiled with NVRTC (no GPU)."""
    ns = _launch_py_names("GEMV_RB", "GEMV_STAGES", "GEMV_WARPS", "gemv_smem_bytes")
    lines = ['#include "gemv.cu"']
    for fmt, F in (("bf16", "Bf16W"), ("f16", "F16W"), ("w4", "Q4W")):
        for op, rb, rows in (("qkv", "RB_QKV", f"{F}::RB_QKV"), ("gateup", "RB_PAIRS", f"2 * {F}::RB_PAIRS"),
                             ("proj", "RB_PROJ", f"{F}::RB_PROJ")):
            for kv in range(1, 9):
                want = ns["gemv_smem_bytes"](fmt, op, kv, ns["GEMV_RB"][fmt][op], ns["GEMV_STAGES"][fmt])
                lines.append(f"static_assert(GV_WARPS * {F}::NS * GvRing<{F}, {kv}, {rows}>::kSlot == {want}, "
                             f'"{fmt} {op} {kv}: the launcher asks for {want} bytes");')
    src = tmp_path / "gemv_smem_check.cu"
    src.write_text("\n".join(lines) + "\n")
    compile_source(str(src), "sm_90")


@pytest.mark.skipif(NVRTC is None, reason="cuda-python / nvidia-cuda-nvrtc / nvidia-cuda-runtime not installed")
def test_attention_shared_memory_the_launcher_passes_is_the_kernels(tmp_path):
    """launch.att_smem_bytes (the dynamic shared memory of attn_partial_w8_<D>, the prefill's partial kernel) equals
    attention.cuh's ATT_SMEM_BYTES and covers the tiles attention.cu lays out in it (Q's 128 rows, a K tile, two V
    tiles): a smaller allocation would let the V tiles' cp.async write past it. Checked by the compiler."""
    ns = _launch_py_names("ATT_TILE", "att_smem_bytes")
    lines = ['#include "attention.cu"']
    for D in (64, 128):
        want = ns["att_smem_bytes"](D, 8)
        lines.append(f"static_assert(ATT_SMEM_BYTES({D}, 8) == {want}, \"D {D}: the launcher asks for {want}\");")
        lines.append(f"static_assert((128 + 3 * ATT_TILE) * ({D} + 8) * 2 <= {want}, \"D {D}: the tiles do not fit\");")
    src = tmp_path / "att_smem_check.cu"
    src.write_text("\n".join(lines) + "\n")
    compile_source(str(src), "sm_90")


def test_gemv_plan_covers_every_published_shape():
    """cuda/launch.py's GEMV plan (no CuPy): for the 0.5B / 1.5B / 3B shapes, each op's instance holds its whole K
    (q/k/v and gate/up in one segment, o / down in S segments of 256 kv), the masking instance (suffix p) runs
    exactly when K leaves the last segment partial, and the 1.5B shape keeps the full instances of before (kv 3 / 7 /
    5: no masking on the design's shape)."""
    from vla_edge_ros.model.config import PRESETS

    ns = _launch_py_names("gemv_kv", "gemv_partial", "proj_segments", "proj_kv", "PROJ_KV", "PROJ_WASTE")
    for preset in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "tiny", "micro", "small"):
        cfg = PRESETS[preset]
        H, I, NQ = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads * cfg.head_dim
        kv = ns["gemv_kv"](H)
        assert 256 * (kv - 1) < H <= 256 * kv <= 2048, preset
        assert ns["gemv_partial"](H, kv) == (H % 256 != 0)
        for key, K in (("o", NQ), ("down", I)):
            for fmt in ("bf16", "f16", "w4"):
                pk = ns["proj_kv"](K, ns["PROJ_KV"][fmt][key])
                S = ns["proj_segments"](K, pk)
                assert 1 <= pk <= ns["PROJ_KV"][fmt][key] and (S - 1) * 256 * pk < K <= S * 256 * pk, (preset, key)
                assert ns["gemv_partial"](K, pk) == (K % (256 * pk) != 0)
                if preset == "qwen2.5-1.5b":
                    assert (pk, ns["gemv_partial"](K, pk)) == ({"o": 3, "down": 5 if fmt == "w4" else 7}[key], False)
    with open(os.path.join(KDIR, "gemv.cu")) as f:
        src = f.read()
    for fmt in ("bf16", "f16"):  # the masking instances exist
        assert f"GV_INSTANCES({fmt}, {fmt.upper()}, GV_MINB_BF16_GATEUP, KV, p, false)" in src
    assert "GV_INSTANCES(w4, W4, 2, KV, , true)" in src


def test_gemm_token_split_policy():
    """launch.gemm_token_split: the 96-row gate/up in two 48-row slices only where its grid holds fewer than 4 blocks
    an SM (the 1.5B 4-bit gate/up: 140 blocks; a whole H100 / H200 has 132 SMs, a board 8)."""
    split = _launch_py_names("gemm_token_split")["gemm_token_split"]
    assert split(96, 140, 132) == 2 and split(96, 280, 132) == 2 and split(96, 76, 132) == 2
    assert split(96, 140, 8) == 1 and split(96, 32, 8) == 1 and split(96, 528, 132) == 1
    assert split(48, 140, 132) == 1 and split(32, 10, 132) == 1


def _gemm_micro_variants():
    """dev/cuda/gemm_micro.py's VARIANTS, read from the source (the script imports CuPy)."""
    import ast

    with open(os.path.join(os.path.dirname(HERE), "dev", "cuda", "gemm_micro.py")) as f:
        tree = ast.parse(f.read())
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "VARIANTS" for t in n.targets):
            return ast.literal_eval(n.value)
    raise AssertionError("no VARIANTS in dev/cuda/gemm_micro.py")


@pytest.mark.skipif(NVRTC is None, reason="cuda-python / nvidia-cuda-nvrtc / nvidia-cuda-runtime not installed")
@pytest.mark.parametrize("name", [n for n, v in _gemm_micro_variants().items() if v[1]])
def test_gemm_micro_variants_compile(name):
    """Each gemm_micro variant's -D defines still build kernels/gemm.cu for sm_90 (the device it is measured on), so a
    kernel change does not leave the dev variants broken until the next GPU call; the launcher's view of the variant
    (threads, shared memory) is checked there, against the fp32 reference."""
    fmt, defines, over = _gemm_micro_variants()[name]
    log, ptx = compile_source(os.path.join(KDIR, "gemm.cu"), "sm_90",
                              extra=["-DVLA_PDL"] + [f"-D{k}={v}" for k, v in defines.items()], want_ptx=True)
    assert "warning" not in log.lower() or "declared but never referenced" in log, log
    threads = 128 * over.get("kw", 1)
    prefix = "gemm_w4" if fmt == "w4" else "gemm_bf16"
    for entry in ptx.split(".entry ")[1:]:
        if entry.startswith(prefix):
            assert f".maxntid {threads}, 1, 1" in entry, (name, entry[:40])
