"""Kernel launches for the CUDA graph: plain, or with Programmatic Dependent Launch (PDL, sm_90+).

A PDL launch (cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION on the capturing
stream) lets the kernel's blocks start while the previous kernel drains; they run up to their PDL_WAIT
(kernels/common.cuh) and may read constant data (weights) before it. The launcher uses PDL only between two
kernels of a ``dependent`` stretch; ``barrier()`` makes the next launch a plain one (everything before it
completes first). Without a Hopper GPU or cuda-python every launch is plain and the hooks are no-ops.
"""
from __future__ import annotations

import ctypes

import cupy
import numpy as np


def _carg(a):
    if isinstance(a, cupy.ndarray):
        return ctypes.c_void_p(a.data.ptr)
    if isinstance(a, np.int32):
        return ctypes.c_int32(int(a))
    if isinstance(a, np.float32):
        return ctypes.c_float(float(a))
    if isinstance(a, np.uint64):
        return ctypes.c_uint64(int(a))
    raise TypeError(f"kernel argument of type {type(a).__name__}: use numpy scalars or cupy arrays")


def _fn_ptr(fn) -> int | None:
    f = getattr(fn, "kernel", fn)
    ptr = getattr(f, "ptr", None)
    return int(ptr) if ptr else None


class Launcher:
    def __init__(self, kernels, stream, pdl: bool = True):
        self.k = kernels
        self.stream = stream
        self.pdl = False
        self._prev_kernel = False
        if pdl and int(cupy.cuda.Device().compute_capability) >= 90:
            try:
                from cuda.bindings import driver as drv
            except ImportError:  # no cuda-python: plain launches, still correct
                drv = None
            if drv is not None and drv.cuInit(0)[0] == drv.CUresult.CUDA_SUCCESS:
                attr = drv.CUlaunchAttribute()
                attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
                attr.value.programmaticStreamSerializationAllowed = 1
                self._drv, self._attr, self.pdl = drv, attr, True

    def barrier(self) -> None:
        """The next launch waits for everything before it (a plain launch)."""
        self._prev_kernel = False

    def __call__(self, name, grid, block, args, shared_mem=0, dependent=True):
        """Launch kernel ``name``: a programmatic dependent of the previous kernel when ``dependent`` and PDL are on."""
        fn = getattr(self.k, name)
        s = self.stream
        ptr = _fn_ptr(fn) if (self.pdl and dependent and self._prev_kernel) else None
        if ptr is not None:
            drv = self._drv
            cargs = [_carg(a) for a in args]
            ptrs = (ctypes.c_void_p * len(cargs))(*[ctypes.addressof(c) for c in cargs])
            g = tuple(grid) + (1,) * (3 - len(grid))
            b = tuple(block) + (1,) * (3 - len(block))
            cfg = drv.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (int(v) for v in g)
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (int(v) for v in b)
            cfg.sharedMemBytes = int(shared_mem)
            cfg.hStream = drv.CUstream(s.ptr)
            cfg.attrs = [self._attr]
            cfg.numAttrs = 1
            (err,) = drv.cuLaunchKernelEx(cfg, drv.CUfunction(ptr), ctypes.addressof(ptrs), 0)
            if err != drv.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuLaunchKernelEx({name}): {err}")
        else:
            fn(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem, stream=s)
        self._prev_kernel = True

    def blocks_per_sm(self, name: str, threads: int = 256, fallback: int = 1) -> int:
        try:
            from cuda.bindings import driver as drv

            err, n = drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                drv.CUfunction(_fn_ptr(getattr(self.k, name))), threads, 0)
            if err == drv.CUresult.CUDA_SUCCESS and n > 0:
                return int(n)
        except Exception:  # noqa: BLE001 - no cuda-python: the __launch_bounds__ minimum
            pass
        return fallback
