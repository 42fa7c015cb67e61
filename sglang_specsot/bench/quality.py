"""Quality of each SoT answer against the same model's normal (plain) answer to the question."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_specsot.bench.configs import BASELINE
from sglang_specsot.bench.metrics import COVER_THRESHOLD, completeness, coverage, length_ratio, sentences
from sglang_specsot.bench.store import OK, CellResult


@dataclass(frozen=True, slots=True)
class Quality:
    """One cell's answer against the plain answer; None where a measure does not apply."""

    question_id: int
    config: str
    normal_covered: float | None  # share of the plain answer's sentences the answer matches
    answer_covered: float | None  # the reverse: share of the answer's sentences the plain one matches
    cosine: float | None  # answer-level cosine (each text cut at 256 tokens)
    length_ratio: float | None  # words / the plain answer's words
    asks: int  # items the question enumerates
    asks_addressed: float | None  # share of them the answer addresses
    threshold: float = COVER_THRESHOLD


def assess(cells: dict[tuple[int, str], CellResult], questions: dict[int, str], embedder) -> list[Quality]:
    """A Quality for every successful cell that has a successful plain answer beside it."""
    out = []
    for (qid, name), cell in sorted(cells.items()):
        base = cells.get((qid, BASELINE))
        if cell.status != OK or base is None or base.status != OK:
            continue
        out.append(_one(cell, base, questions.get(qid, ""), embedder))
    return out


def _one(cell: CellResult, base: CellResult, question: str, embedder) -> Quality:
    mine, theirs = sentences(cell.answer), sentences(base.answer)
    vectors = embedder.encode(mine + theirs + [cell.answer or " ", base.answer or " "])
    a, b = vectors[: len(mine)], vectors[len(mine) : len(mine) + len(theirs)]
    sim = (b @ a.T).tolist() if len(mine) and len(theirs) else [[] for _ in theirs]
    reverse = (a @ b.T).tolist() if len(mine) and len(theirs) else [[] for _ in mine]
    asks, addressed = completeness(question, cell.answer)
    return Quality(cell.question_id, cell.config, coverage(sim), coverage(reverse),
                   float(vectors[-2] @ vectors[-1]), length_ratio(cell.answer, base.answer), asks, addressed)  # fmt: skip
