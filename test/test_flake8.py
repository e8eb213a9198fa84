# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""flake8 over the package, its tests, launch files and scripts (ament_flake8, config in setup.cfg)."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["vla_edge_ros", "test", "launch", "scripts", "setup.py"]


@pytest.mark.flake8
@pytest.mark.linter
def test_flake8():
    main_with_errors = pytest.importorskip("ament_flake8.main").main_with_errors
    rc, errors = main_with_errors(argv=["--config", str(ROOT / "setup.cfg")] + [str(ROOT / p) for p in PATHS])
    assert rc == 0, "Found %d code style errors / warnings:\n" % len(errors) + "\n".join(errors)
