"""Quality of each SoT answer against the same model's normal (plain) answer to the question."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from sglang_specsot.bench.configs import BASELINE
from sglang_specsot.bench.metrics import COVER_THRESHOLD, completeness, coverage, length_ratio, matched_coverage, sentences
from sglang_specsot.bench.reading import without_shared_opening
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
    normal_matched: float | None = None  # normal_covered matched one to one (metrics.matched_coverage)
    threshold: float = COVER_THRESHOLD
    # normal_covered without the opening paragraph both answers share word for word (a SoT
    # answer copies the normal answer's opening, which no branch wrote; reading.without_shared_opening)
    normal_covered_body: float | None = None


@dataclass(frozen=True, slots=True)
class Control:
    """What the coverage measures give an answer of known completeness, over `questions`
    suitable questions: each question's normal answer against a part of itself or against
    another question's normal answer."""

    name: str  # first half | other question
    questions: int
    covered: float  # mean normal_covered
    matched: float  # mean normal_matched


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
                   float(vectors[-2] @ vectors[-1]), length_ratio(cell.answer, base.answer), asks, addressed,
                   matched_coverage(sim), normal_covered_body=_body_coverage(cell.answer, base.answer, embedder, sim))  # fmt: skip


def _body_coverage(answer: str, normal: str, embedder, sim) -> float | None:
    """normal_covered with the shared opening removed from both answers (`sim` where none is shared)."""
    answer_body, normal_body = without_shared_opening(answer, normal)
    if answer_body == answer:
        return coverage(sim)
    mine, theirs = sentences(answer_body), sentences(normal_body)
    if not mine or not theirs:
        return 0.0 if theirs else None
    vectors = embedder.encode(mine + theirs)
    return coverage((vectors[len(mine) :] @ vectors[: len(mine)].T).tolist())


def controls(cells: dict[tuple[int, str], CellResult], embedder) -> list[Control]:
    """The coverage measures checked on answers whose completeness is known, on the suitable
    questions with a normal answer: the first half of its own sentences (a measure of
    completeness should give about 0.5) and the next such question's normal answer (about
    0). Empty with fewer than two such questions."""
    bases = [c for (_, name), c in sorted(cells.items()) if name == BASELINE and c.status == OK and c.suitable]
    if len(bases) < 2:
        return []
    parts = {
        "first half": [_first_half(base.answer) for base in bases],
        "other question": [bases[(i + 1) % len(bases)].answer for i in range(len(bases))],
    }
    out = []
    for name, answers in parts.items():
        scored = [_one(dataclasses.replace(base, answer=answer), base, "", embedder) for base, answer in zip(bases, answers)]
        scored = [q for q in scored if q.normal_covered is not None]  # both measures read one similarity matrix
        if scored:
            out.append(Control(name, len(scored), statistics.fmean(q.normal_covered for q in scored),
                               statistics.fmean(q.normal_matched for q in scored)))  # fmt: skip
    return out


def _first_half(answer: str) -> str:
    """The first half (rounded down) of an answer's sentences, one a line."""
    parts = sentences(answer)
    return "\n".join(parts[: len(parts) // 2])
