# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Every source file carries the copyright line and the SPDX identifier of the package's license (the job
ament_copyright does in a ROS workspace; it has no PyPI wheel), and the license is the same in package.xml,
setup.py and LICENSE. scripts/add_license_headers.py adds a missing header."""
from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("add_license_headers", ROOT / "scripts" / "add_license_headers.py")
headers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(headers)


@pytest.mark.copyright
@pytest.mark.linter
def test_every_source_file_has_the_header():
    files = headers.source_files()
    assert len(files) > 100  # the globs still find the tree
    missing = [str(p.relative_to(ROOT)) for p in files
               if not headers.has_header(p.read_text().splitlines(keepends=True))]
    assert not missing, f"no '{headers.HOLDER}' / '{headers.SPDX}' header (scripts/add_license_headers.py): {missing}"


@pytest.mark.copyright
@pytest.mark.linter
def test_one_license_everywhere():
    lic = ET.parse(ROOT / "package.xml").getroot().find("license")
    assert lic.text == "Apache-2.0" and lic.get("file") == "LICENSE"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert 'license="Apache-2.0"' in (ROOT / "setup.py").read_text()
    assert headers.SPDX.endswith("Apache-2.0")
