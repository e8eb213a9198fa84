# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Is a CUDA GPU usable here? One answer for the whole package (the core must run without one)."""


def cupy_with_gpu():
    """CuPy when it imports and sees a GPU, else None."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device all mean "no GPU"
        pass
    return None


def cuda_available() -> bool:
    return cupy_with_gpu() is not None
