# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla-edge-bench with several models side by side: each model runs every policy, the report names each run's
weights and action decoding, and the admission of a parallel model counts its own phases (40 prefill tokens,
no decode)."""
import json

import pytest

from vla_edge_ros.tools import bench
from vla_edge_ros.model.generate import make_model


@pytest.mark.slow
def test_two_models_side_by_side(tmp_path):
    a, b = tmp_path / "ar", tmp_path / "par"
    make_model(str(a), preset="micro", seed=0)
    make_model(str(b), preset="micro", seed=0, quant="awq", action_decoding="parallel")
    out = tmp_path / "out"
    rc = bench.main(["--model", str(a), "--model", str(b), "--clip", "synthetic", "--policies", "fifo",
                     "--seconds", "2", "--period-ms", "50", "--backend", "numpy", "--out", str(out), "--quiet"])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    runs = report["clips"][0]["policies"]
    assert list(runs) == ["ar[bf16]:fifo", "par[w4-parallel]:fifo"]
    assert report["model"]["weights"] == ["bf16", "w4"]
    assert report["model"]["action_decoding"] == ["autoregressive", "parallel"]
    ar, par = runs["ar[bf16]:fifo"], runs["par[w4-parallel]:fifo"]
    assert (ar["weights"], ar["action_decoding"]) == ("bf16", "autoregressive")
    assert (par["weights"], par["action_decoding"]) == ("w4", "parallel")
    assert ar["model_actions"] > 0 and par["model_actions"] > 0
    assert par["admission"]["decode_per_token"] == 0.0 and par["admission"]["prefill_per_token"] > 0
    adm = par["admission"]  # the estimate counts 40 prefill tokens (tail_k 0)
    assert adm["estimate"] == pytest.approx(adm["vision"] + 40 * adm["prefill_per_token"] + adm["other"], rel=1e-9)
    md = (out / "report.md").read_text()
    assert "| ar[bf16]:fifo |" in md and "| par[w4-parallel]:fifo |" in md
    assert (out / "report.png").stat().st_size > 0
