"""examples/router_finetune.py: the epoch and threshold chosen by cross-validation under the
trainer's rule (no fine-tuning runs here: `choose` reads held-out probabilities)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from sglang_specsot.models import router_classifier as rc

# Long tier: an offline research example (not a served path) whose runs took 15-31 s of the
# default tier's unit time on the EPYC-AVX2.
pytestmark = pytest.mark.long

_PATH = Path(__file__).resolve().parents[3] / "examples" / "router_finetune.py"
_spec = importlib.util.spec_from_file_location("router_finetune", _PATH)
finetune = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(finetune)


def _probabilities(data: rc.TrainingSet, signal_by_epoch: list[float], seed: int) -> np.ndarray:
    """Held-out probabilities per epoch: the label plus noise, stronger where the signal is."""
    rng = np.random.default_rng(seed)
    rows = []
    for signal in signal_by_epoch:
        z = signal * (2 * data.labels - 1) + rng.normal(size=len(data.labels))
        rows.append(1 / (1 + np.exp(-z)))
    return np.stack(rows)


def test_it_chooses_the_epoch_that_separates_the_labels():
    data = rc.load_training_set(rc.TRAIN_SETS)
    epochs, threshold, cv = finetune.choose(data, _probabilities(data, [0.0, 3.0, 0.5, 0.0], seed=0))
    assert epochs == 2 and threshold in finetune.THRESHOLD_GRID
    assert cv.precision >= rc.MIN_PRECISION and cv.total == len(data.labels)


def test_without_signal_no_setting_is_precise_enough():
    data = rc.load_training_set(rc.TRAIN_SETS)
    with pytest.raises(ValueError, match="no setting reaches cross-validated precision"):
        finetune.choose(data, _probabilities(data, [0.0, 0.0], seed=1))


def test_the_check_sets_are_never_trained_on():
    assert not set(finetune.CHECK_SETS) & set(rc.TRAIN_SETS)
    assert "sot_wizardlm" in finetune.CHECK_SETS
