"""The report's "what a reader sees" table: bench.reading over each SoT configuration's answers,
with the answers the router (or a fallback) sent to the normal path counted apart."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sglang_specsot.bench.configs import BASELINE
from sglang_specsot.bench.quality import Quality
from sglang_specsot.bench.reading import AnswerReading, read_answer
from sglang_specsot.bench.report import skeleton_titles
from sglang_specsot.bench.store import OK, CellResult


@dataclass(frozen=True, slots=True)
class ReaderRow:
    """One SoT configuration's answers that went through SoT, as a reader sees them."""

    config: str
    sot_answers: int
    routed_normal: int  # answered on the normal path: none of the measures below include them
    words_ratio_median: float | None  # visible words SoT / normal
    words_ratio_min: float | None
    words_ratio_max: float | None
    points: int
    thin_points: int  # at most one sentence beyond the title
    full_points: int  # three sentences or more beyond the title
    restating_points: int  # the body opens by restating the title or the question
    glued_titles: int  # an imperative title continued as a subject
    one_item_lead_ins: int
    repeated_points: int  # points that repeat another point (bench.reading.repeated_points)
    points_vs_items: str  # per question: SoT points / the normal answer's items
    covered_body: float | None  # covers the normal answer, shared opening removed (SoT answers)
    covered_routed: float | None  # the same over the routed-normal answers, apart


def readings(cells: dict[tuple[int, str], CellResult], questions: dict[int, str], config: str) -> dict[int, AnswerReading]:
    """{question_id: AnswerReading} of `config`'s SoT-path answers that have a plain answer."""
    out = {}
    for (qid, name), cell in sorted(cells.items()):
        base = cells.get((qid, BASELINE))
        if name == config and cell.status == OK and cell.path == "sot" and base and base.status == OK:
            out[qid] = read_answer(cell.answer, skeleton_titles(cell.skeleton_text), base.answer, questions.get(qid, ""))
    return out


def reader_rows(cells: dict[tuple[int, str], CellResult], questions: dict[int, str], quality: list[Quality]) -> list[ReaderRow]:
    """A ReaderRow for every configuration with an answer on the SoT path."""
    configs = sorted({name for (_, name), c in cells.items() if c.path == "sot" and c.status == OK})
    return [_row(config, cells, questions, quality) for config in configs]


def reader_per_question(cells: dict[tuple[int, str], CellResult], questions: dict[int, str]) -> list[dict]:
    """Per SoT answer: its visible-words ratio, items, lead-ins, repeats, and each point's reading."""
    from dataclasses import asdict

    configs = sorted({name for (_, name), c in cells.items() if c.path == "sot" and c.status == OK})
    return [{"question_id": qid, "config": config, "words_ratio": r.words_ratio, "points": len(r.points),
             "normal_items": r.normal_items, "one_item_lead_ins": r.one_item_lead_ins,
             "repeated": [list(pair) for pair in r.repeated], "per_point": [asdict(p) for p in r.points]}
            for config in configs for qid, r in readings(cells, questions, config).items()]  # fmt: skip


def _row(config: str, cells, questions, quality: list[Quality]) -> ReaderRow:
    found = readings(cells, questions, config)
    routed = [c for (_, n), c in cells.items() if n == config and c.status == OK and c.path != "sot"]
    ratios = [r.words_ratio for r in found.values() if r.words_ratio is not None]
    points = [p for r in found.values() for p in r.points]
    body = {q.question_id: q.normal_covered_body for q in quality if q.config == config}
    mean = lambda ids: _mean(body.get(i) for i in ids)  # noqa: E731
    return ReaderRow(
        config, len(found), len(routed),
        statistics.median(ratios) if ratios else None, min(ratios, default=None), max(ratios, default=None),
        len(points), sum(p.sentences <= 1 for p in points), sum(p.sentences >= 3 for p in points),
        sum(p.restates for p in points), sum(p.glued for p in points),
        sum(r.one_item_lead_ins for r in found.values()), sum(len({j for _, j in r.repeated}) for r in found.values()),
        ", ".join(f"q{q} {len(r.points)}/{r.normal_items}" for q, r in found.items()),
        mean(found), mean(c.question_id for c in routed),
    )  # fmt: skip


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


COLUMNS = [("config", "config"), ("sot_answers", "SoT answers"), ("routed_normal", "routed normal (apart)"),
           ("words_ratio_median", "visible words SoT/normal (median)"), ("words_ratio_min", "(min)"),
           ("words_ratio_max", "(max)"), ("points", "points"), ("thin_points", "points with <=1 sentence"),
           ("full_points", "points with >=3"), ("restating_points", "points restating title/question"),
           ("glued_titles", "glued titles"), ("one_item_lead_ins", "one-item lead-ins"),
           ("repeated_points", "repeated points"), ("covered_body", "covers normal, opening removed"),
           ("covered_routed", "(routed normal)")]  # fmt: skip


def markdown(rows: list[ReaderRow]) -> str:
    """The rows as a table, then each configuration's points / normal items per question."""
    from dataclasses import asdict

    fmt = lambda v: "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(t for _, t in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(fmt(asdict(r)[k]) for k, _ in COLUMNS) + " |" for r in rows]
    lines += ["", "SoT points / the normal answer's items, per question:", ""]
    lines += [f"- {r.config}: {r.points_vs_items or '-'}" for r in rows]
    return "\n".join(lines) + "\n"
