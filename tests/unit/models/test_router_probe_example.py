"""examples/router_probe.py evaluate: the choice by cross-validation, then one score on the check set."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from sglang_specsot.sot.agreement import load_labelled

_PATH = Path(__file__).resolve().parents[3] / "examples" / "router_probe.py"
_spec = importlib.util.spec_from_file_location("router_probe", _PATH)
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


def _store(out: Path, signal: float, seed: int) -> None:
    """Per set, two "layers" of 6 numbers: L1 carries the label in its first number, L2 is noise."""
    rng = np.random.default_rng(seed)
    for name in probe.SETS:
        labels = np.array([r.sot_suitable for r in load_labelled(name)], dtype=float)
        informative = rng.normal(size=(len(labels), 6))
        informative[:, 0] += signal * (2 * labels - 1)
        np.savez(out / f"{name}.npz", labels=labels, L1=informative, L2=rng.normal(size=(len(labels), 6)))


def test_it_chooses_the_informative_depth_and_scores_the_check_once(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "L2_GRID", (1.0,))
    monkeypatch.setattr(probe, "THRESHOLD_GRID", (0.5, 0.7))
    _store(tmp_path, signal=3.0, seed=0)
    result = probe.evaluate(tmp_path)
    assert result["layer"] == "L1" and result["sot_wizardlm"]["n"] == 215
    assert result["cross_validated"]["precision"] >= 0.85
    # the hard rules route some suitable-labelled questions normally, so recall stays below 1
    assert result["sot_wizardlm"]["precision"] >= 0.85 and result["sot_wizardlm"]["accuracy"] >= 0.85


def test_without_signal_no_setting_is_precise_enough(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "L2_GRID", (1.0,))
    monkeypatch.setattr(probe, "THRESHOLD_GRID", (0.5,))
    _store(tmp_path, signal=0.0, seed=1)
    with pytest.raises(ValueError, match="no setting reaches cross-validated precision"):
        probe.evaluate(tmp_path)
