"""Agreement of router decisions with reference labels: confusion matrix and its rates."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RouterAgreement:
    """Confusion matrix of predicted vs labelled SoT suitability ("positive" = use SoT)."""

    true_pos: int
    false_pos: int
    false_neg: int
    true_neg: int

    @property
    def total(self) -> int:
        return self.true_pos + self.false_pos + self.false_neg + self.true_neg

    @property
    def accuracy(self) -> float:
        return (self.true_pos + self.true_neg) / self.total if self.total else 0.0

    @property
    def precision(self) -> float:
        predicted = self.true_pos + self.false_pos
        return self.true_pos / predicted if predicted else 0.0

    @property
    def recall(self) -> float:
        actual = self.true_pos + self.false_neg
        return self.true_pos / actual if actual else 0.0


def measure_agreement(pairs: Iterable[tuple[bool, bool]]) -> RouterAgreement:
    """Count (predicted, label) pairs into a confusion matrix."""
    counts = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    for predicted, label in pairs:
        counts[(bool(predicted), bool(label))] += 1
    return RouterAgreement(
        true_pos=counts[(True, True)],
        false_pos=counts[(True, False)],
        false_neg=counts[(False, True)],
        true_neg=counts[(False, False)],
    )
