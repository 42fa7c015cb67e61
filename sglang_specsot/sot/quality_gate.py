"""Whether SoT's answer would read worse than the normal answer: the quality router.

The shape router (sot/router.py) decides whether a question's answer is a list of points; it
cannot see whether the points SoT writes apart will read as well as the answer the model writes
in one go. Blind readers judged that on tuning questions (SoT forced against the greedy normal
answer, benchmarks/e2e-router-quality-tuning-*), and a logistic head learns their "SoT worse"
from one of two representations, chosen by leave-one-out on those verdicts
(`python -m sglang_specsot.models.quality_router train`):

- "skeleton": read after the skeleton and before any branch is spent, from the planned
  titles and the question (`skeleton_features`): what readers blamed was mostly the plan
  (points that overlap, drift from the premise, or miss the question's own words);
- "question": the question's sentence embedding, the vector the shape classifier computes.

The shipped head is sglang_specsot/data/quality_head.json; where training found no
representation that ranks losses above chance, no file ships and nothing is vetoed. Scoring a
head is a dot product, so this module is plain Python.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar
from itertools import combinations
from pathlib import Path

from sglang_specsot.sot.router_head import HEAD_PATH, LinearHead, load_head
from sglang_specsot.sot.stems import WORD, content_stems

# Found by file path, as router_head finds its head (sot/ may not import the data package).
QUALITY_HEAD_PATH = Path(__file__).resolve().parent.parent / "data" / "quality_head.json"
# Which head a server or the frontend program loads: unset, the shipped one (where one ships);
# a path, a head `quality_router train --out` wrote; "off", none.
QUALITY_HEAD_ENV = "SGLANG_SPECSOT_QUALITY_HEAD"
SKELETON, QUESTION = "skeleton", "question"
# The head's `embedding` names what it reads; a skeleton head reads these numbers, in order.
SKELETON_FEATURES = "skeleton-features-v1"
T = TypeVar("T")  # SoTOptions, which imports this module
FEATURE_NAMES = ("points", "max_title_overlap", "off_question_share", "mean_title_words", "question_words")


def skeleton_features(question: str, titles: Sequence[str]) -> tuple[float, ...]:
    """The plan's numbers the skeleton head reads (FEATURE_NAMES): how many points, how much the
    two closest titles share (Jaccard of content stems), the share of titles with no content word
    of the question, the mean title length in words, the question's length in words."""
    if not titles:
        raise ValueError("skeleton_features needs the plan's titles; a skeleton with no points has no plan")
    stems = [content_stems(t) for t in titles]
    overlap = max((_jaccard(a, b) for a, b in combinations(stems, 2)), default=0.0)
    asked = content_stems(question)
    off = sum(1 for s in stems if not s & asked) / len(stems)
    words = sum(len(WORD.findall(t)) for t in titles) / len(titles)
    return (float(len(titles)), overlap, off, words, float(len(WORD.findall(question))))


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


@dataclass(frozen=True, slots=True)
class QualityVerdict:
    """The head's P(SoT's answer reads worse) and whether it reaches the head's threshold."""

    probability: float
    threshold: float
    representation: str

    @property
    def worse(self) -> bool:
        return self.probability >= self.threshold

    @property
    def reason(self) -> str:
        relation = ">=" if self.worse else "<"
        return (f"the quality head ({self.representation}) gives P(SoT reads worse)={self.probability:.2f} "
                f"{relation} {self.threshold:.2f}")  # fmt: skip


@dataclass(frozen=True, slots=True)
class QualityGate:
    """A trained head and the representation it reads (SKELETON or QUESTION)."""

    head: LinearHead

    def __post_init__(self) -> None:
        if self.representation == SKELETON and len(self.head.weights) != len(FEATURE_NAMES):
            raise ValueError(f"a {SKELETON_FEATURES} head needs {len(FEATURE_NAMES)} weights, "
                             f"got {len(self.head.weights)}; retrain it")  # fmt: skip
        if self.representation == QUESTION:
            self._check_reads_the_classifiers_vector()

    def _check_reads_the_classifiers_vector(self) -> None:
        shape_head = load_head(HEAD_PATH)  # the vector a question head reads is the classifier's
        if (self.head.embedding, len(self.head.weights)) != (shape_head.embedding, len(shape_head.weights)):
            raise ValueError(f"a question quality head reads {shape_head.embedding!r} embeddings of "
                             f"{len(shape_head.weights)} numbers (the question classifier's), this one "
                             f"{self.head.embedding!r} of {len(self.head.weights)}; retrain it")  # fmt: skip

    @property
    def representation(self) -> str:
        return SKELETON if self.head.embedding == SKELETON_FEATURES else QUESTION

    def on_plan(self, question: str, titles: Sequence[str]) -> QualityVerdict | None:
        """The verdict on a planned skeleton; None for a head that reads the question instead."""
        if self.representation != SKELETON:
            return None
        return self._verdict(skeleton_features(question, titles))

    def on_question(self, vector: Sequence[float]) -> QualityVerdict | None:
        """The verdict on a question's embedding; None for a head that reads the skeleton."""
        if self.representation != QUESTION:
            return None
        return self._verdict(vector)

    def _verdict(self, vector: Sequence[float]) -> QualityVerdict:
        return QualityVerdict(self.head.probability(vector), self.head.threshold, self.representation)


def load_quality_gate(path: str | Path = QUALITY_HEAD_PATH) -> QualityGate | None:
    """The shipped quality head, or None where none ships (nothing is vetoed then). A file that
    exists but cannot be read raises ValueError, as the shape router's head does."""
    path = Path(path)
    if not path.exists():
        return None
    return QualityGate(load_head(path))


def with_configured_gate(options: T) -> T:
    """`options` (a `SoTOptions`) with the configured gate, in mode "auto" when it has none and
    one is configured; else `options` itself. The server and the frontend program both call it."""
    gate = configured_quality_gate() if options.mode == "auto" and options.quality_gate is None else None
    return options if gate is None else dataclasses.replace(options, quality_gate=gate)


@functools.cache
def configured_quality_gate() -> QualityGate | None:
    """The gate SGLANG_SPECSOT_QUALITY_HEAD names (unset: the shipped head, if any; "off":
    none; else a head file), loaded once per process."""
    value = os.environ.get(QUALITY_HEAD_ENV, "").strip()
    if value.lower() == "off":
        return None
    if value and not Path(value).is_file():
        raise ValueError(f"{QUALITY_HEAD_ENV}={value!r} is no file; give a head that "
                         "`python -m sglang_specsot.models.quality_router train --out` wrote, or 'off'")  # fmt: skip
    return load_quality_gate(value or QUALITY_HEAD_PATH)
