"""examples/router_ceiling.py: the in-distribution bound finds signal where the features carry the
labels and none where they do not (synthetic features; no embedder runs here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from sglang_specsot.models import router_classifier as rc

# Long tier: an offline research example (not a served path) whose runs took 15-31 s of the
# default tier's unit time on the EPYC-AVX2.
pytestmark = pytest.mark.long

_PATH = Path(__file__).resolve().parents[3] / "examples" / "router_ceiling.py"
_spec = importlib.util.spec_from_file_location("router_ceiling", _PATH)
ceiling = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ceiling)

SET = "sot_wizardlm"


def _features(signal: float, seed: int):
    labels = dict(zip(rc.load_training_set([SET]).questions, rc.load_training_set([SET]).labels))

    def features(name, questions):
        rng = np.random.default_rng(seed)
        y = np.array([labels[q] for q in questions])
        return np.stack([signal * (2 * y - 1) + rng.normal(size=len(y)) for _ in range(4)], axis=1)

    return features


def test_labels_the_features_carry_are_within_reach():
    out = ceiling.ceiling(SET, _features(4.0, seed=0))
    best = out["in_distribution_best"]
    assert out["n"] == 215 and 0.7 < out["answer_all_normally"] < 0.75
    assert best["precision"] >= ceiling.MIN_PRECISION and best["accuracy"] >= 0.95


def test_labels_the_features_do_not_carry_stay_at_answering_all_normally():
    out = ceiling.ceiling(SET, _features(0.0, seed=1))
    best = out["in_distribution_best"]
    assert best is None or best["accuracy"] <= out["answer_all_normally"] + 0.03


def test_transfer_scores_the_check_set_with_the_other_sets_head():
    out = ceiling.transfer(SET, SET, _features(4.0, seed=2))
    assert out["n"] == 215 and out["best_any_threshold"]["accuracy"] >= 0.95


def test_features_are_computed_once_per_set():
    calls = []
    cached = ceiling._cached(lambda name, questions: calls.append(name) or np.zeros((len(questions), 2)))
    cached(SET, ["a"]), cached(SET, ["a"])
    assert calls == [SET]


def test_probe_features_are_the_stored_depth_normalised_and_checked_against_the_set(tmp_path):
    stack = np.array([[3.0, 4.0], [0.0, 2.0]])
    np.savez(tmp_path / f"{SET}.npz", labels=np.zeros(2), L20=stack)
    x = ceiling.probe_features(tmp_path, "L20")(SET, ["q1", "q2"])
    unit = np.array([[0.6, 0.8], [0.0, 1.0]])
    assert np.allclose(x, (unit - unit.mean(0)) * 10)
    with pytest.raises(ValueError, match="re-run extract"):
        ceiling.probe_features(tmp_path, "L20")(SET, ["q1", "q2", "q3"])
