"""The question classifier's linear head: P(SoT suits the question) from a sentence embedding.

A logistic regression over all-MiniLM-L6-v2 embeddings (384 numbers, unit length), trained on
the project's labelled question sets (`python -m sglang_specsot.models.router_classifier
train`, which also chooses the L2 strength and the threshold by cross-validation). The head
ships as JSON in sglang_specsot/data/router_classifier.json. Scoring it is a dot product, so
this module is plain Python; computing the embedding is not (models/router_classifier.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Found by file path, as agreement.py finds the question sets: sot/ may not import the data
# package (the purity test allows only pure packages), and reading a file needs no import.
HEAD_PATH = Path(__file__).resolve().parent.parent / "data" / "router_classifier.json"


@dataclass(frozen=True, slots=True)
class Suitability:
    """The classifier's verdict on one question: P(list-shaped) against its threshold, and the
    question's embedding it read (for a quality head that reads the same vector; () if none)."""

    probability: float
    threshold: float
    vector: tuple[float, ...] = field(default=(), repr=False, compare=False)

    @property
    def use_sot(self) -> bool:
        return self.probability >= self.threshold


@dataclass(frozen=True, slots=True)
class LinearHead:
    """w . x + b -> sigmoid; `threshold` is where SoT starts (set low or high for recall or
    precision). `provenance` records how it was trained, for the README and the eval command."""

    weights: tuple[float, ...]
    bias: float
    threshold: float
    embedding: str  # the sentence-embedding model the weights belong to
    provenance: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.weights or not all(math.isfinite(w) for w in self.weights):
            raise ValueError("weights must be a non-empty sequence of finite numbers")
        if not math.isfinite(self.bias):
            raise ValueError(f"bias={self.bias!r} must be a finite number")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold={self.threshold!r} must lie strictly between 0 and 1")

    def probability(self, vector: Sequence[float]) -> float:
        if len(vector) != len(self.weights):
            raise ValueError(
                f"the embedding has {len(vector)} numbers, the head expects {len(self.weights)} "
                f"({self.embedding})"
            )
        z = self.bias + math.fsum(w * x for w, x in zip(self.weights, vector))
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))

    def suitability(self, vector: Sequence[float]) -> Suitability:
        return Suitability(self.probability(vector), self.threshold, tuple(vector))

    def to_json(self) -> str:
        return json.dumps({"embedding": self.embedding, "threshold": self.threshold, "bias": self.bias,
                           "weights": list(self.weights), "provenance": self.provenance}, indent=1)  # fmt: skip


def load_head(path: str | Path = HEAD_PATH) -> LinearHead:
    """The head stored at `path` (default: the shipped one); ValueError naming what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
        return LinearHead(
            weights=tuple(float(w) for w in data["weights"]),
            bias=float(data["bias"]),
            threshold=float(data["threshold"]),
            embedding=str(data["embedding"]),
            provenance=dict(data.get("provenance", {})),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(
            f"cannot read a router head from {path}: {exc!r}; train one with "
            "`python -m sglang_specsot.models.router_classifier train`"
        ) from None
