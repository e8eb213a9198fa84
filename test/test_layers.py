# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The package's layers hold (DESIGN.md §2): core never imports nodes/ or tools/, nodes/ never imports tools/, every
core module outside cuda/ imports with rclpy, the ROS message packages and CuPy unavailable, and cuda/ needs nothing
of ROS (only CuPy)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _import_graph():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_import_points_the_wrong_way():
    ig = _import_graph()
    g = ig.graph()
    assert "vla_edge_ros.nodes.reasoning_node" in g and "vla_edge_ros.tools.bench" in g  # the walk saw the package
    assert ig.violations(g) == []


def test_design_shows_the_graph_the_script_draws():
    """docs/DESIGN.md §2 shows the import graph as the script draws it now (python3 scripts/import_graph.py
    --write-design puts it there)."""
    ig = _import_graph()
    shown = ig.design_graph((ROOT / "docs" / "DESIGN.md").read_text())
    assert shown is not None, "docs/DESIGN.md lost the import-graph mark"
    assert shown == ig.report(ig.graph()), "docs/DESIGN.md §2: run python3 scripts/import_graph.py --write-design"


def test_the_walk_sees_an_import_inside_a_function(tmp_path):
    """The checker itself: a core module that imports tools/ inside a function is a violation."""
    ig = _import_graph()
    pkg = tmp_path / "vla_edge_ros"
    (pkg / "tools").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "tools" / "__init__.py").write_text("")
    (pkg / "tools" / "x.py").write_text("")
    (pkg / "core_mod.py").write_text("def f():\n    from .tools import x\n    return x\n")
    ig.ROOT = pkg
    bad = ig.violations(ig.graph())
    assert bad == ["vla_edge_ros.core_mod (core) imports vla_edge_ros.tools.x (tools) at line 2"]


BLOCKER = r"""
import importlib, importlib.abc, pkgutil, sys
BLOCKED = ("rclpy", "cupy", "cupy_backends", "sensor_msgs", "geometry_msgs", "std_msgs", "diagnostic_msgs",
           "builtin_interfaces", "rosidl_runtime_py", "cv_bridge", "ament_index_python")

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, Block())
import vla_edge_ros
core, cuda = [], []
for m in pkgutil.walk_packages(vla_edge_ros.__path__, "vla_edge_ros."):
    layer = m.name.split(".")[1]
    if layer in ("nodes", "tools"):
        continue
    if layer == "cuda" and m.name != "vla_edge_ros.cuda":
        try:
            importlib.import_module(m.name)
        except ImportError as e:
            assert "cupy" in str(e), f"{m.name} needs more than CuPy: {e}"
        cuda.append(m.name)
        continue
    importlib.import_module(m.name)
    core.append(m.name)
print(len(core), "core modules imported:", " ".join(core))
print(len(cuda), "cuda modules need only CuPy:", " ".join(cuda))
"""


def test_every_core_module_imports_without_ros_and_cupy():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", BLOCKER], env=env, capture_output=True, text=True, timeout=120,
                       cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "vla_edge_ros.cycle" in r.stdout and "vla_edge_ros.cuda.backend" in r.stdout, r.stdout
