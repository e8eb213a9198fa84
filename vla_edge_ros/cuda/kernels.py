# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Load kernels/*.cu as CuPy RawModules (NVRTC, compiled for the GPU present: no fixed arch).

The sources come from the installed share directory (`share/vla_edge_ros/kernels`, found through
ament_index when it is importable) or, in a source checkout, from the repository's `kernels/`.
Every file is compiled with -DVLA_PDL: the PDL_TRIGGER / PDL_WAIT hooks of common.cuh become griddepcontrol
instructions on sm_90+ (no-ops below, and no-ops for launches without the PDL attribute).
"""
from __future__ import annotations

import glob
import os
import re

import cupy

_PKG = "vla_edge_ros"


def kernel_dir() -> str:
    try:
        from ament_index_python.packages import get_package_share_directory

        d = os.path.join(get_package_share_directory(_PKG), "kernels")
        if glob.glob(os.path.join(d, "*.cu")):
            return d
    except Exception:  # noqa: BLE001 - no ROS / package not installed: fall back to the source tree
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    d = os.path.join(os.path.dirname(os.path.dirname(here)), "kernels")
    if glob.glob(os.path.join(d, "*.cu")):
        return d
    raise FileNotFoundError(f"no kernels/*.cu found (looked in the {_PKG} share directory and {d})")


class Kernels:
    """All kernel functions by name, one RawModule per kernels/*.cu file. Names the source regex does not see
    (macro-generated instances such as gemv_bf16_qkv_6 or gemv_w4_proj_5) are looked up lazily."""

    def __init__(self, directory: str | None = None):
        self.directory = directory or kernel_dir()
        self.modules: dict[str, cupy.RawModule] = {}
        self.functions: dict[str, object] = {}
        opts = ("-std=c++17", f"-I{self.directory}", "-DVLA_PDL")
        for path in sorted(glob.glob(os.path.join(self.directory, "*.cu"))):
            with open(path) as f:
                src = f.read()
            mod = cupy.RawModule(code=src, options=opts)
            self.modules[os.path.basename(path)[:-3]] = mod
            for fn in _extern_c_names(src):
                self.functions[fn] = mod.get_function(fn)

    def __getattr__(self, name):
        funcs = self.__dict__.get("functions")
        if funcs is None:
            raise AttributeError(name)
        if name in funcs:
            return funcs[name]
        if not name.startswith("_"):
            for mod in self.__dict__["modules"].values():
                try:
                    fn = mod.get_function(name)
                except Exception:  # noqa: BLE001 - not in this module
                    continue
                funcs[name] = fn
                return fn
        raise AttributeError(name)


def _extern_c_names(src: str) -> list[str]:
    names = re.findall(r'extern "C" __global__ void(?:\s+__launch_bounds__\([^)]*\))?\s+(\w+)\s*\(', src)
    return [n for n in names if not n.startswith("__")]  # macro-generated definitions: looked up lazily
