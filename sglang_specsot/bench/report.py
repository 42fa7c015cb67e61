"""Summaries from the cells JSONL: per question and per subset, as JSON and a markdown table."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace

from sglang_specsot.bench.configs import BASELINE, GREEDY_PAIRS
from sglang_specsot.bench.endings import endings
from sglang_specsot.bench.metrics import LOSS, TIE, WIN
from sglang_specsot.bench.quality import Quality
from sglang_specsot.bench.store import OK, CellResult

SUBSETS = {"all": lambda c: True, "suitable": lambda c: c.suitable, "unsuitable": lambda c: not c.suitable}


@dataclass(frozen=True, slots=True)
class Row:
    """One configuration on one subset of questions (means over its successful cells)."""

    config: str
    subset: str
    ok: int
    failed: int
    speedup: float | None  # geometric mean of plain latency / this latency, same question
    latency: float | None  # median seconds to the complete answer
    tokens: float | None
    tokens_per_s: float | None
    skeleton_s: float | None
    longest_branch_s: float | None
    points: float | None
    accept_length: float | None
    sot_share: float | None  # answered by SoT (not the router's or a fallback's normal path)
    fallback: float | None  # SoT tried, but the skeleton was no plan: the normal answer followed
    hit_cap: float | None  # share whose answer (or a branch) hit the token cap
    looped: float | None
    branch_loops: float | None  # share of SoT branches that ended in a loop (trace "ended")
    empty_points: float | None  # share of SoT points whose branch gave nothing but the title
    # SoT points that end cut (bench.endings), counted over the row's SoT answers: mid-sentence,
    # and on a lead-in with nothing or one item after it ("Here are some tips:" and no tip, or one).
    mid_sentence_points: int | None
    lead_in_points: int | None
    flawed_skeletons: int | None  # skeletons holding code or a repeated point (see skeleton_flawed)
    normal_covered: float | None
    min_normal_covered: float | None  # the worst question's coverage
    normal_matched: float | None  # normal_covered matched one to one (metrics.matched_coverage)
    answer_covered: float | None
    cosine: float | None
    length_ratio: float | None
    asks_addressed: float | None
    judge: str = ""  # "wins/ties/losses" of this answer against the plain one (both orders agree)
    judge_calibrated: str = ""  # the same from log-probabilities, position bias cancelled
    # Completion tokens over the normal answer's to the same question (every generated token:
    # skeleton, branches, retries), the median and the largest over the questions.
    tokens_ratio_median: float | None = None
    tokens_ratio_max: float | None = None


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def _geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in vals)) if vals else None


def speedups(cells: dict[tuple[int, str], CellResult], config: str) -> dict[int, float]:
    """Per question: plain decoding's latency / this configuration's, both successful."""
    return _against_plain(cells, config, lambda cell, base: base.latency / cell.latency if cell.latency > 0 else None)


def token_ratios(cells: dict[tuple[int, str], CellResult], config: str) -> dict[int, float]:
    """Per question: this configuration's completion tokens / plain decoding's, both successful."""
    ratio = lambda cell, base: cell.output_tokens / base.output_tokens if base.output_tokens > 0 else None  # noqa: E731
    return _against_plain(cells, config, ratio)


def _against_plain(cells: dict[tuple[int, str], CellResult], config: str,
                   compare: Callable[[CellResult, CellResult], float | None]) -> dict[int, float]:  # fmt: skip
    """Per question where this configuration's cell and plain's both succeeded: `compare(cell,
    plain's cell)`, where it gives a value."""
    out = {}
    for (qid, name), cell in cells.items():
        base = cells.get((qid, BASELINE))
        if name == config and cell.status == OK and base and base.status == OK:
            value = compare(cell, base)
            if value is not None:
                out[qid] = value
    return out


def summarize(cells: dict[tuple[int, str], CellResult], quality: list[Quality], judged: dict | None = None,
              configs: list[str] | None = None, calibrated: dict | None = None) -> list[Row]:  # fmt: skip
    """A Row for every configuration x subset that has cells."""
    quality_by = {(q.question_id, q.config): q for q in quality}
    names = configs or list(dict.fromkeys(name for _, name in sorted(cells, key=lambda k: k[1] != BASELINE)))
    rows = []
    for name in names:
        ups, lengths = speedups(cells, name), token_ratios(cells, name)
        for subset, keep in SUBSETS.items():
            mine = [c for (_, n), c in cells.items() if n == name and keep(c)]
            if mine:
                verdicts = ((judged or {}).get(name, {}), (calibrated or {}).get(name, {}))
                ratios = [lengths[c.question_id] for c in mine if c.question_id in lengths]
                row = _row(name, subset, mine, ups, quality_by, *verdicts)
                rows.append(replace(row, tokens_ratio_median=statistics.median(ratios) if ratios else None,
                                    tokens_ratio_max=max(ratios, default=None)))  # fmt: skip
    return rows


def _wtl(judged: dict[int, str], ok: list[CellResult]) -> str:
    """'wins/ties/losses' over the cells that have a verdict ('' if none has)."""
    verdicts = [judged[c.question_id] for c in ok if c.question_id in judged]
    return "/".join(str(verdicts.count(v)) for v in (WIN, TIE, LOSS)) if verdicts else ""


def _row(name, subset, mine: list[CellResult], ups, quality_by, judged: dict, calibrated: dict) -> Row:
    ok = [c for c in mine if c.status == OK]
    q = [quality_by[c.key] for c in ok if c.key in quality_by]
    attr: Callable = lambda f: _mean(f(c) for c in ok)  # noqa: E731
    sot = [c for c in ok if c.path == "sot"]
    return Row(
        name, subset, len(ok), len(mine) - len(ok),
        _geomean([ups[c.question_id] for c in ok if c.question_id in ups]),
        statistics.median(c.latency for c in ok) if ok else None,
        attr(lambda c: c.output_tokens), attr(lambda c: c.tokens_per_s),
        _mean(c.skeleton_seconds for c in ok), _mean(c.longest_branch for c in sot),
        _mean(c.points for c in sot), attr(lambda c: c.accept_length),
        attr(lambda c: float(c.path == "sot")), attr(lambda c: float(c.fallback)), attr(lambda c: float(c.hit_cap)), attr(lambda c: float(c.looped)),
        _mean(float(b.ended == "loop") for c in sot for b in c.branches), _empty_share(sot),
        *_cut_points(sot),
        sum(skeleton_flawed(c.skeleton_text) for c in ok if c.skeleton_text) if ok else None,
        _mean(x.normal_covered for x in q), min((x.normal_covered for x in q if x.normal_covered is not None), default=None),
        _mean(x.normal_matched for x in q), _mean(x.answer_covered for x in q), _mean(x.cosine for x in q),
        _mean(x.length_ratio for x in q), _mean(x.asks_addressed for x in q),
        _wtl(judged, ok), _wtl(calibrated, ok),
    )  # fmt: skip


def _empty_share(sot: list[CellResult]) -> float | None:
    """Empty points over the points of the SoT answers that counted them (cells recorded
    without the count have None)."""
    counted = [c for c in sot if c.empty_points is not None]
    points = sum(c.points for c in counted)
    return sum(c.empty_points for c in counted) / points if points else None


def _cut_points(sot: list[CellResult]) -> tuple[int | None, int | None]:
    """(points ending mid-sentence, points ending on an empty or one-item lead-in) over the SoT answers;
    None for both where there is none. Read from the answers, so older runs are counted too."""
    if not sot:
        return None, None
    found = [endings(c.answer, skeleton_titles(c.skeleton_text)) for c in sot]
    return sum(len(e.mid_sentence) for e in found), sum(len(e.lead_in) for e in found)


def skeleton_titles(skeleton_text: str) -> list[str]:
    """The titles of a recorded skeleton as the parser kept them; [] for none."""
    from sglang_specsot.sot import parse_skeleton

    return [p.text for p in parse_skeleton(skeleton_text).points] if skeleton_text else []


def skeleton_flawed(text: str) -> bool:
    """Whether a skeleton holds code or repeats a point: what the constraint exists to prevent
    (the parser sends such a skeleton to the normal answer, but it still cost its time)."""
    from sglang_specsot.sot import parse_skeleton

    parse = parse_skeleton(text)
    return "code" in parse.reason or "repeats" in parse.reason or any("duplicate" in n for n in parse.notes)


def greedy_equality(cells: dict[tuple[int, str], CellResult]) -> dict[str, dict]:
    """For each lossless pair: on how many questions both answers are identical."""
    out = {}
    for a, b in GREEDY_PAIRS:
        both = _both_answered(cells, a, b)
        if both:
            same = [x.question_id for x, y in both if x.answer == y.answer]
            out[f"{a} == {b}"] = {"equal": len(same), "of": len(both),
                                  "differ": sorted(x.question_id for x, y in both if x.answer != y.answer)}  # fmt: skip
    return out


def _both_answered(cells: dict[tuple[int, str], CellResult], a: str, b: str) -> list[tuple[CellResult, CellResult]]:
    """The (a, b) cells of every question both configurations answered successfully."""
    pairs = [(c, cells.get((qid, b))) for (qid, n), c in cells.items() if n == a]
    return [(x, y) for x, y in pairs if x.status == OK and y is not None and y.status == OK]


def lossless_speed(cells: dict[tuple[int, str], CellResult]) -> dict[str, dict]:
    """For each lossless pair: per question, the second's seconds per completion token over the
    first's (above 1: the first is faster), and their geometric mean. Per token, because in
    bfloat16 the pair's answers may differ in length; `latency` includes the prompt's prefill,
    which both pay alike."""
    out = {}
    for a, b in GREEDY_PAIRS:
        ratios = {x.question_id: (y.latency / y.output_tokens) / (x.latency / x.output_tokens)
                  for x, y in _both_answered(cells, a, b)
                  if min(x.output_tokens, y.output_tokens) > 0 and min(x.latency, y.latency) > 0}  # fmt: skip
        if ratios:
            out[f"{a} vs {b}"] = {"per_token_speed": round(_geomean(list(ratios.values())), 4), "n": len(ratios),
                                  "min": round(min(ratios.values()), 4), "max": round(max(ratios.values()), 4),
                                  "per_question": {q: round(r, 4) for q, r in sorted(ratios.items())}}  # fmt: skip
    return out


def per_question(cells: dict[tuple[int, str], CellResult], quality: list[Quality]) -> list[dict]:
    quality_by = {(q.question_id, q.config): asdict(q) for q in quality}
    ups: dict[str, dict[int, float]] = {}
    lengths: dict[str, dict[int, float]] = {}
    out = []
    for key, cell in sorted(cells.items()):
        up = ups.setdefault(cell.config, speedups(cells, cell.config)).get(cell.question_id)
        ratio = lengths.setdefault(cell.config, token_ratios(cells, cell.config)).get(cell.question_id)
        row = {"question_id": cell.question_id, "config": cell.config, "status": cell.status,
               "reason": cell.reason, "suitable": cell.suitable, "latency": cell.latency, "speedup": up,
               "tokens": cell.output_tokens, "tokens_ratio": ratio, "tokens_per_s": cell.tokens_per_s, "path": cell.path,
               "skeleton_s": cell.skeleton_seconds, "longest_branch_s": cell.longest_branch,
               "points": cell.points, "accept_length": cell.accept_length, "hit_cap": cell.hit_cap,
               "looped": cell.looped, "fallback": cell.fallback, "empty_points": cell.empty_points,
               "load": cell.load, "commit": cell.commit}  # fmt: skip
        if cell.route_latency:  # mode "auto": what the latency model predicted and chose
            row.update(route_latency=cell.route_latency, predicted_ratio=cell.route_latency.get("ratio"))
        if cell.status == OK and cell.path == "sot":
            found = endings(cell.answer, skeleton_titles(cell.skeleton_text))
            row.update(mid_sentence=len(found.mid_sentence), lead_in=len(found.lead_in), cut_points=found.cut)
        q = quality_by.get(key, {})
        row.update({k: q[k] for k in ("normal_covered", "normal_matched", "normal_covered_body", "answer_covered", "cosine",
                                       "length_ratio", "asks", "asks_addressed") if k in q})  # fmt: skip
        out.append(row)
    return out


COLUMNS = [("config", "config"), ("subset", "subset"), ("ok", "ok"), ("failed", "failed"),
           ("speedup", "speed-up vs plain"), ("latency", "median s"), ("tokens", "out tok"),
           ("tokens_ratio_median", "tokens / normal (median)"), ("tokens_ratio_max", "(max)"),
           ("tokens_per_s", "tok/s"), ("skeleton_s", "skeleton s"), ("longest_branch_s", "longest branch s"),
           ("points", "points"), ("accept_length", "accept"), ("sot_share", "SoT path"),
           ("fallback", "fallback"),           ("hit_cap", "hit cap"), ("looped", "looped"), ("branch_loops", "branch loops"),
           ("empty_points", "empty points"), ("mid_sentence_points", "mid-sentence points"),
           ("lead_in_points", "lead-ins cut (empty or one item)"),
           ("flawed_skeletons", "flawed skeletons"), ("normal_covered", "covers normal"),
           ("min_normal_covered", "worst covers normal"), ("normal_matched", "covers normal 1:1"),
           ("answer_covered", "covered by normal"), ("cosine", "cosine"), ("length_ratio", "length ratio"),
           ("asks_addressed", "asks addressed"), ("judge", "judge W/T/L"),
           ("judge_calibrated", "judge W/T/L calibrated")]  # fmt: skip


def _fmt(value) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def markdown(rows: list[Row]) -> str:
    """The summary rows as one markdown table."""
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        data = asdict(row)
        lines.append("| " + " | ".join(_fmt(data[key]) for key, _ in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


QUESTION_COLUMNS = [("question_id", "q"), ("config", "config"), ("status", "status"), ("latency", "s"),
                    ("speedup", "speed-up"), ("tokens", "out tok"), ("tokens_ratio", "tokens / normal"),
                    ("path", "path"),
                    ("predicted_ratio", "predicted SoT/normal"), ("points", "points"),
                    ("skeleton_s", "skeleton s"), ("longest_branch_s", "longest branch s"),
                    ("accept_length", "accept"), ("hit_cap", "hit cap"), ("looped", "looped"),
                    ("cut_points", "cut points"),
                    ("normal_covered", "covers normal"), ("normal_matched", "covers normal 1:1"),
                    ("asks_addressed", "asks addressed"), ("load", "load avg")]  # fmt: skip


def question_markdown(rows: list[dict]) -> str:
    """Per-question rows (from `per_question`) as a markdown table."""
    lines = ["| " + " | ".join(t for _, t in QUESTION_COLUMNS) + " |", "|" + "---|" * len(QUESTION_COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(k)) for k, _ in QUESTION_COLUMNS) + " |")
    return "\n".join(lines) + "\n"
