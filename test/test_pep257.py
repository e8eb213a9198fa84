# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""pep257 (pydocstyle) over the package, its tests, launch files and scripts, as the ament_python template runs it.

The ignore list lives in setup.cfg's [pydocstyle] section (ament's convention with one change, explained there).
"""

import configparser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["vla_edge_ros", "test", "launch", "scripts", "setup.py"]


def ignore_list() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return [c.strip() for c in cfg["pydocstyle"]["ignore"].split(",") if c.strip()]


@pytest.mark.linter
@pytest.mark.pep257
def test_pep257():
    main = pytest.importorskip("ament_pep257.main").main
    rc = main(argv=["--ignore", *ignore_list(), "--"] + [str(ROOT / p) for p in PATHS])
    assert rc == 0, "Found code style errors / warnings"
