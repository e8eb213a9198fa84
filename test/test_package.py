# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""package.xml against the code: every import is declared, every declared key resolves on Jazzy.

``rosdep install --from-paths . -y`` on a fresh Jazzy / Ubuntu 24.04 machine must install everything the
package imports; a key that does not exist makes rosdep fail outright.  The keys are checked against
``test/rosdep_keys_jazzy.txt`` (taken from ros/rosdistro; the file names the commit).
"""

from __future__ import annotations

import ast
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Third-party top-level module -> rosdep key.
MODULE_KEYS = {
    "numpy": "python3-numpy",
    "cv2": "python3-opencv",
    "rosbags": "python3-rosbags-pip",
    "matplotlib": "python3-matplotlib",
    "tqdm": "python3-tqdm",
    "yaml": "python3-yaml",
    "pytest": "python3-pytest",
    "hypothesis": "python3-hypothesis",
    "rclpy": "rclpy",
    "rcl_interfaces": "rcl_interfaces",
    "lifecycle_msgs": "lifecycle_msgs",
    "builtin_interfaces": "builtin_interfaces",
    "sensor_msgs": "sensor_msgs",
    "std_msgs": "std_msgs",
    "geometry_msgs": "geometry_msgs",
    "trajectory_msgs": "trajectory_msgs",
    "diagnostic_msgs": "diagnostic_msgs",
    "cv_bridge": "cv_bridge",
    "ament_index_python": "ament_index_python",
    "launch": "launch",
    "launch_ros": "launch_ros",
    "bondpy": "bondpy",
    "rosgraph_msgs": "rosgraph_msgs",
    "ament_flake8": "ament_flake8",
    "ament_pep257": "ament_pep257",
}

# Imported only behind a GPU / optional-feature check and without a rosdep key: pip extras in setup.py.
OPTIONAL = {
    "cupy": "cuda",
    "cupyx": "cuda",
    "cuda": "cuda",
    "nvidia": "cuda",
    "tokenizers": "tokenizer",
    "jinja2": "tokenizer",
    "gguf": "gguf",
    "xxhash": "gguf",  # the converted-weights cache of GGUF files (model/converted_cache.py)
    "ray": "fleet",  # vla-edge-fleet only: a workstation / cluster tool, not part of the robot's node
}

# rosdep key -> pip requirement name in setup.py install_requires (ROS packages come from the ROS install).
PIP_NAMES = {
    "python3-numpy": "numpy",
    "python3-opencv": "opencv-python-headless",
    "python3-rosbags-pip": "rosbags",
    "python3-matplotlib": "matplotlib",
    "python3-tqdm": "tqdm",
    "python3-yaml": "pyyaml",
}

RUN_TAGS = ("depend", "exec_depend", "build_export_depend")
TEST_TAGS = ("depend", "exec_depend", "test_depend")


def declared(package_xml: Path) -> dict[str, set[str]]:
    """Tag -> the keys package.xml declares with it."""
    root = ET.parse(package_xml).getroot()
    out: dict[str, set[str]] = {}
    for el in root:
        if isinstance(el.tag, str) and el.tag.endswith("depend"):
            out.setdefault(el.tag, set()).add(el.text.strip())
    return out


def known_keys(path: Path = ROOT / "test" / "rosdep_keys_jazzy.txt") -> set[str]:
    keys = set()
    for line in path.read_text().splitlines():
        word = line.split("#", 1)[0].strip()
        if word:
            keys.add(word)
    return keys


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    """Return the top-level module names a file imports absolutely (all, or only those at module level)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def third_party(names: set[str], local: set[str]) -> set[str]:
    return {n for n in names if n not in sys.stdlib_module_names and n != "__future__" and n not in local}


def problems(files: list[Path], keys: set[str], local: set[str], top_level_only: bool = False) -> list[str]:
    """One line per import that package.xml does not cover (given the keys declared for these files)."""
    out = []
    for f in files:
        for mod in sorted(third_party(imports(f, top_level_only), local)):
            if mod in OPTIONAL:
                continue
            key = MODULE_KEYS.get(mod)
            if key is None:
                out.append(f"{f.relative_to(ROOT)} imports {mod!r}: no rosdep key known for it (add it to "
                           f"MODULE_KEYS after checking rosdistro, and declare it in package.xml)")
            elif key not in keys:
                out.append(f"{f.relative_to(ROOT)} imports {mod!r}: declare {key} in package.xml "
                           f"(<depend> or <exec_depend>; <test_depend> for tests only)")
    return out


def package_files() -> list[Path]:
    return sorted((ROOT / "vla_edge_ros").rglob("*.py")) + sorted((ROOT / "launch").glob("*.py"))


def test_every_import_of_the_package_is_declared():
    d = declared(ROOT / "package.xml")
    run = set().union(*(d.get(t, set()) for t in RUN_TAGS))
    assert problems(package_files(), run, {"vla_edge_ros"}) == []


def test_module_level_test_imports_are_declared():
    d = declared(ROOT / "package.xml")
    keys = set().union(*(d.get(t, set()) for t in TEST_TAGS))
    tests = sorted((ROOT / "test").glob("*.py"))
    local = {"vla_edge_ros", "conftest"} | {p.stem for p in tests}
    assert problems(tests, keys, local, top_level_only=True) == []


def test_every_declared_key_resolves_on_jazzy():
    known = known_keys()
    d = declared(ROOT / "package.xml")
    unknown = sorted(k for ks in d.values() for k in ks if k not in known)
    assert unknown == [], f"not rosdep keys on Jazzy (per test/rosdep_keys_jazzy.txt): {unknown}"
    assert set(MODULE_KEYS.values()) <= known


def test_yaml_launch_needs_launch_yaml():
    if list((ROOT / "launch").glob("*.launch.yaml")):
        assert "launch_yaml" in declared(ROOT / "package.xml").get("exec_depend", set())


def _setup_py():
    return ast.parse((ROOT / "setup.py").read_text())


def _setup_kwargs() -> dict:
    for node in ast.walk(_setup_py()):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup":
            return {kw.arg: kw.value for kw in node.keywords}
    raise AssertionError("setup.py: no setup() call")


def test_setup_py_install_requires_matches_package_xml():
    kw = _setup_kwargs()
    requires = {re.split(r"[<>=!~ ;\[]", s, maxsplit=1)[0] for s in ast.literal_eval(kw["install_requires"])}
    d = declared(ROOT / "package.xml")
    run = set().union(*(d.get(t, set()) for t in RUN_TAGS))
    missing = sorted(PIP_NAMES[k] for k in run if k in PIP_NAMES and PIP_NAMES[k] not in requires)
    assert missing == [], f"setup.py install_requires lacks {missing}"
    extras = ast.literal_eval(kw["extras_require"])
    for mod, extra in OPTIONAL.items():
        assert extra in extras, f"setup.py extras_require lacks {extra!r} (for {mod})"


def test_console_scripts():
    kw = _setup_kwargs()
    scripts = ast.literal_eval(kw["entry_points"])["console_scripts"]
    names = {s.split("=")[0].strip(): s.split("=")[1].strip() for s in scripts}
    assert names["vla-edge-quantize"] == "vla_edge_ros.tools.quantize:main"
    assert names["vla-edge-plan"] == "vla_edge_ros.tools.plan:main"
    for name in ("vla_edge", "vla-edge-replay", "vla-edge-bench", "vla-edge-demo", "vla-edge-soak",
                 "vla-edge-make-model"):
        assert name in names
    # Modules other than the two above (which other work adds) must exist.
    for name, target in names.items():
        module = target.split(":")[0]
        if name not in ("vla-edge-quantize", "vla-edge-plan"):
            assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), target


@pytest.mark.parametrize("source, declared_keys, bad", [
    ("import matplotlib.pyplot as plt\n", {"python3-numpy"}, True),
    ("def f():\n    from rosbags.highlevel import AnyReader\n", {"python3-numpy"}, True),
    ("import somethingnew\n", {"python3-numpy"}, True),
    ("import os\nimport numpy\nfrom . import x\n", {"python3-numpy"}, False),
    ("def f():\n    import cupy\n", set(), False),
])
def test_checker_catches_an_undeclared_import(tmp_path, monkeypatch, source, declared_keys, bad):
    # The checker reports paths relative to ROOT: put the probe file under a temporary ROOT.
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    f = tmp_path / "probe.py"
    f.write_text(source)
    assert bool(problems([f], declared_keys, {"vla_edge_ros"})) == bad


def _bash(script: str) -> str:
    import subprocess

    r = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.skipif(not (ROOT / "scripts" / "env.sh").is_file() or not (ROOT / ".venv" / "bin").is_dir(),
                    reason="needs the repository's .venv (scripts/setup.sh)")
def test_env_sh_puts_the_console_scripts_on_path():
    bin_dir = str(ROOT / "install" / "vla_edge_ros" / "lib" / "vla_edge_ros")
    # Sourced twice and in either order with install/setup.bash: the folder is on PATH exactly once.
    setup = ". install/setup.bash; " if (ROOT / "install" / "setup.bash").is_file() else ""
    for script in (f". scripts/env.sh; {setup}. scripts/env.sh; echo $PATH",
                   f"{setup}. scripts/env.sh; echo $PATH"):
        assert _bash(script).strip().split(":").count(bin_dir) == 1
    if (Path(bin_dir) / "vla_edge").is_file():
        assert _bash(f". scripts/env.sh; {setup}command -v vla_edge").strip() == bin_dir + "/vla_edge"


def test_design_citations_point_at_sections_that_exist():
    """Code and docs cite "DESIGN.md §N" / "DESIGN §N": docs/DESIGN.md must have a section N."""
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    sections = {int(m) for m in re.findall(r"^## (\d+)\. ", design, re.M)}
    cited = {}
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if not path.is_file() or parts[0] in (".venv", "build", "install", "log", ".git", "out") or \
                path.suffix not in (".py", ".md", ".yaml", ".xml", ".sh", ".txt", ".cu", ".cuh"):
            continue
        for n in re.findall(r"DESIGN(?:\.md)? ?§ ?(\d+)", path.read_text(errors="replace")):
            cited.setdefault(int(n), []).append(str(path.relative_to(ROOT)))
    missing = {n: files for n, files in cited.items() if n not in sections}
    assert cited and not missing, f"cited sections missing from docs/DESIGN.md: {missing}"


def test_interfaces_lists_modules_that_exist():
    text = (ROOT / "docs" / "INTERFACES.md").read_text()
    table = text.split("| module |", 1)[1].split("\n\n", 1)[0]
    first_cells = [row.split("|")[1] for row in table.splitlines()[2:] if row.startswith("|")]
    names = [n for cell in first_cells for n in re.findall(r"`([a-z_/]+(?:\.py|/))`", cell)]
    assert len(names) > 10
    for name in names:
        assert (ROOT / "vla_edge_ros" / name).exists(), name
    for name in re.findall(r"`(model/[a-z_]+\.py)`", text):
        assert (ROOT / "vla_edge_ros" / name).exists(), name
    # and the other way round: every top-level module and sub-package is on the map
    listed = set(re.findall(r"`([a-z_]+\.py|[a-z_]+/)`", table))
    present = {p.name for p in (ROOT / "vla_edge_ros").glob("*.py") if p.name != "__init__.py"} | {
        p.name + "/" for p in (ROOT / "vla_edge_ros").iterdir() if (p / "__init__.py").is_file()}
    assert present <= listed, f"modules missing from docs/INTERFACES.md: {sorted(present - listed)}"
