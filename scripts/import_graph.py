#!/usr/bin/env python3
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Draw the package's import graph by layer and list the imports that point the wrong way.

    python3 scripts/import_graph.py            # the graph as text (docs/DESIGN.md shows it), then the violations
    python3 scripts/import_graph.py --check    # only the violations; exit 1 if there is any
    python3 scripts/import_graph.py --write-design  # put the graph into docs/DESIGN.md §2 (test/test_layers.py
                                                    # checks that the one there is this script's)

Layers (DESIGN.md §2): core = the top-level modules, model/ and cuda/ (ROS-free); nodes/ (ROS); tools/ (console
scripts). core never imports nodes/ or tools/; nodes/ never imports tools/. Imports inside functions count too:
an import hidden in a function still ties the layers together. test/test_layers.py runs the check.
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = "vla_edge_ros"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
# which layer a module's first path part puts it in; anything else (the top-level modules) is core
LAYERS = {"nodes": "nodes", "tools": "tools", "model": "core", "cuda": "core"}
FORBIDDEN = {("core", "nodes"), ("core", "tools"), ("nodes", "tools")}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    return LAYERS.get(parts[1], "core") if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else "core"


def imports_of(path: Path) -> list[tuple[str, int, bool]]:
    """(imported package module, line, inside a function) for every import of this package in `path`."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.split(".")[0] == PACKAGE:
                    names = [f"{target}.{a.name}" for a in child.names]
                    found.extend((n if is_module(n) else target, child.lineno, in_function) for n in names)
            elif isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function) for a in child.names
                             if a.name.split(".")[0] == PACKAGE)
            visit(child, inner)

    visit(tree, False)
    return found


def is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def graph() -> dict[str, set[tuple[str, int, bool]]]:
    g: dict[str, set] = defaultdict(set)
    for path in sorted(ROOT.rglob("*.py")):
        me = module_name(path)
        g[me]  # every module appears, importing nothing or not
        for target, line, in_function in imports_of(path):
            if target != me:
                g[me].add((target, line, in_function))
    return g


def violations(g) -> list[str]:
    out = []
    for src, targets in sorted(g.items()):
        for dst, line, _ in sorted(targets):
            if (layer_of(src), layer_of(dst)) in FORBIDDEN:
                out.append(f"{src} ({layer_of(src)}) imports {dst} ({layer_of(dst)}) at line {line}")
    return out


def short(module: str) -> str:
    return module[len(PACKAGE) + 1:] or PACKAGE


def draw(g) -> str:
    lines = []
    for layer in ("core", "nodes", "tools"):
        lines.append(f"[{layer}]")
        for src in sorted(m for m in g if layer_of(m) == layer):
            deps = sorted({short(d) for d, _, _ in g[src]})
            if deps or not src.endswith("__init__") and short(src) != PACKAGE:
                lines.append(f"  {short(src):28s} -> {', '.join(deps) if deps else '(nothing of the package)'}")
    hidden = sum(1 for t in g.values() for _, _, f in t if f)
    lines.append(f"imports of the package inside functions: {hidden}")
    return "\n".join(lines)


DESIGN = ROOT.parent / "docs" / "DESIGN.md"
DESIGN_MARK = "<!-- import graph: written by `python3 scripts/import_graph.py --write-design` -->"


def report(g) -> str:
    """What the script prints: the graph, then the imports that point the wrong way."""
    bad = violations(g)
    return "\n".join([draw(g), f"imports that point the wrong way: {len(bad)}", *(f"  {line}" for line in bad)])


def design_graph(text: str) -> str | None:
    """The graph docs/DESIGN.md shows: the fenced block after DESIGN_MARK (None without the mark)."""
    if DESIGN_MARK not in text:
        return None
    block = text.split(DESIGN_MARK, 1)[1].split("```", 2)
    return block[1].strip("\n") if len(block) == 3 else None


def write_design(g, path: Path = DESIGN) -> None:
    text = path.read_text()
    old = design_graph(text)
    if old is None:
        raise SystemExit(f"{path}: no {DESIGN_MARK} followed by a fenced block")
    head, tail = text.split(DESIGN_MARK, 1)
    path.write_text(head + DESIGN_MARK + tail.replace(old, report(g), 1))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    g = graph()
    bad = violations(g)
    if "--write-design" in argv:
        write_design(g)
        return 0
    if "--check" not in argv:
        print(report(g))
    else:
        print("\n".join(report(g).splitlines()[-1 - len(bad):]))
    return 1 if bad and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main())
