"""The project's speed and quality goals, checked against a report's summary rows (suitable
questions unless said).

SpecSoT >= 3.0x plain decoding, >= 1.5x the best speculative-only configuration and >= 1.5x
SoT alone on the same route, at quality parity (the SoT answer covers >= 0.9 of the normal
answer's sentences, and the judge's losses do not exceed its wins); the router brings no
slowdown on unsuitable questions. Ratios between two configurations are ratios of their
geometric-mean speed-ups over plain decoding.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sglang_specsot.bench.configs import BASELINE, SAMPLED_RUNS
from sglang_specsot.bench.report import Row

VS_PLAIN, VS_SPEC, VS_SOT, MIN_COVERAGE = 3.0, 1.5, 1.5, 0.9
# The quality bar: no question's answer below this coverage, loop-ended branches
# under this share, no skeleton with code or a repeated point, and no point that ends cut.
WORST_COVERAGE, MAX_BRANCH_LOOPS = 0.6, 0.05
SPEC_ONLY = ("NGRAM", "SPECSOT-ctx", "STANDALONE", "EAGLE3", "EAGLE", "SPECSOT")
SOT_ALONE = {"SpecSoT-server": "SoT-server", "SpecSoT-frontend": "SoT-frontend"}
ROUTER = "SpecSoT-router"
SOT_CONFIGS = ("SoT-server", "SpecSoT-server", "SoT-frontend", "SpecSoT-frontend")
# A SoT answer as long as the question needs: its completion tokens over the normal answer's,
# per question, a median within this range and none above the most.
TOKENS_RATIO_RANGE, TOKENS_RATIO_MOST = (0.7, 1.3), 1.6


@dataclass(frozen=True, slots=True)
class Goal:
    name: str
    value: float | str | None  # None: not measured (yet)
    target: str
    met: bool | None  # None: not measured


def check(rows: list[Row], judge_counts: bool = False) -> list[Goal]:
    """One Goal per (SpecSoT configuration, criterion), then the router's; the judge's goals
    are measured only where its verdicts count (`judge_counts`: it passed its controls)."""
    by = {(r.config, r.subset): r for r in rows}
    suitable = {c: r for (c, s), r in by.items() if s == "suitable"}
    goals: list[Goal] = []
    best_spec = max((suitable[c].speedup for c in SPEC_ONLY if c in suitable and suitable[c].speedup), default=None)
    for name, alone in SOT_ALONE.items():
        row = suitable.get(name)
        up = row.speedup if row else None
        sot = suitable[alone].speedup if alone in suitable else None
        goals.append(_at_least(f"{name} vs plain", up, VS_PLAIN))
        goals.append(_at_least(f"{name} vs best speculative-only", _ratio(up, best_spec), VS_SPEC))
        goals.append(_at_least(f"{name} vs {alone}", _ratio(up, sot), VS_SOT))
        goals.append(_at_least(f"{name} covers the normal answer", row.normal_covered if row else None, MIN_COVERAGE))
        goals.extend(_quality(name, row))
        goals.append(_judge(f"{name} judge (calibrated)", row.judge_calibrated if row else "", judge_counts))
        goals.append(_judge(f"{name} judge (both orders agree)", row.judge if row else "", judge_counts))
    for name in SOT_CONFIGS:
        if name in suitable:
            goals.extend(_length(name, suitable[name]))
    router = by.get((ROUTER, "unsuitable"))
    goals.append(_at_least(f"{ROUTER} vs plain on unsuitable questions", router.speedup if router else None, 1.0))
    return goals


@dataclass(frozen=True, slots=True)
class Against:
    """One configuration's coverage of the normal answer beside the ceiling on its questions."""

    config: str
    questions: int
    covered: float  # mean over its suitable questions
    ceiling: float  # mean of the sampled answers' coverage on the same questions
    below_every_sample: list[int]  # questions it covers less of than every sampled answer does


@dataclass(frozen=True, slots=True)
class Ceiling:
    """How much of the greedy normal answer other normal answers of the same model (sampled,
    SAMPLED_RUNS) cover on the suitable questions: what the coverage measure can reach."""

    questions: int
    samples: float  # sampled answers per question, on average
    mean: float  # over questions, of each question's mean over its samples
    worst: float  # the lowest question mean
    configs: list[Against]


def coverage_ceiling(per_question: list[dict], key: str = "normal_covered") -> Ceiling | None:
    """The ceiling of the measure `key` (normal_covered, or normal_matched: one to one) from
    `report.per_question` rows; None when the run has no sampled cells."""
    scored = [r for r in per_question if r["suitable"] and r["status"] == "ok" and r.get(key) is not None]
    samples: dict[int, list[float]] = {}
    for r in scored:
        if r["config"] in SAMPLED_RUNS:
            samples.setdefault(r["question_id"], []).append(r[key])
    if not samples:
        return None
    means = {q: statistics.fmean(v) for q, v in samples.items()}
    configs = []
    for name in dict.fromkeys(r["config"] for r in scored):
        if name == BASELINE or name in SAMPLED_RUNS:
            continue
        mine = {r["question_id"]: r[key] for r in scored if r["config"] == name and r["question_id"] in means}
        if mine:
            below = sorted(q for q, c in mine.items() if c < min(samples[q]))
            configs.append(Against(name, len(mine), statistics.fmean(mine.values()),
                                   statistics.fmean(means[q] for q in mine), below))  # fmt: skip
    return Ceiling(len(means), statistics.fmean(len(v) for v in samples.values()),
                   statistics.fmean(means.values()), min(means.values()), configs)  # fmt: skip


def ceiling_markdown(ceiling: Ceiling, measure: str = "Coverage") -> str:
    lines = [
        f"{measure} ceiling: other normal answers of the same model ({', '.join(SAMPLED_RUNS)}; "
        f"{ceiling.samples:.1f} per question) cover {ceiling.mean:.2f} of the greedy normal answer on "
        f"{ceiling.questions} suitable questions (worst question {ceiling.worst:.2f}). An answer that covers "
        "as much is as close to the normal answer as the model's own answers are to each other; one that "
        "covers less than every sample on a question has lost content there.", "",
        f"| config | questions | {measure.lower()} of normal | ceiling, same questions | below every sample |",
        "|---|---|---|---|---|",
    ]  # fmt: skip
    for a in ceiling.configs:
        below = ", ".join(f"q{q}" for q in a.below_every_sample) or "none"
        lines.append(f"| {a.config} | {a.questions} | {a.covered:.2f} | {a.ceiling:.2f} | {below} |")
    return "\n".join(lines) + "\n"


def controls_markdown(controls: list) -> str:
    """The coverage measures on answers of known completeness (quality.controls)."""
    lines = ["What the coverage measures give answers of known completeness (each suitable question's "
             "normal answer against the first half of its own sentences, and against the next question's "
             "normal answer): a measure of completeness gives the first ~0.5 and the second ~0.", "",
             "| control | questions | coverage | coverage 1:1 |", "|---|---|---|---|"]  # fmt: skip
    lines += [f"| {c.name} | {c.questions} | {c.covered:.2f} | {c.matched:.2f} |" for c in controls]
    return "\n".join(lines) + "\n"


def _quality(name: str, row: Row | None) -> list[Goal]:
    worst = row.min_normal_covered if row else None
    loops = row.branch_loops if row else None
    flawed = row.flawed_skeletons if row else None
    cut = row.mid_sentence_points + row.lead_in_points if row and row.mid_sentence_points is not None else None
    return [
        _at_least(f"{name} worst question covers the normal answer", worst, WORST_COVERAGE),
        Goal(f"{name} loop-ended branches", loops, f"< {MAX_BRANCH_LOOPS:g}", None if loops is None else loops < MAX_BRANCH_LOOPS),
        Goal(f"{name} skeletons with code or repeated points", flawed, "0", None if flawed is None else flawed == 0),
        Goal(f"{name} points ending mid-sentence or on an empty lead-in", cut, "0",
             None if cut is None else cut == 0),
    ]  # fmt: skip


def _length(name: str, row: Row) -> list[Goal]:
    """Whether the answers are about as long as the normal ones: speed bought by writing less
    is no speed-up, and writing more costs time where rows are dear."""
    low, high = TOKENS_RATIO_RANGE
    median, most = row.tokens_ratio_median, row.tokens_ratio_max
    return [
        Goal(f"{name} tokens / normal answer's, median", median, f"{low:g}-{high:g}",
             None if median is None else low <= median <= high),
        Goal(f"{name} tokens / normal answer's, largest", most, f"<= {TOKENS_RATIO_MOST:g}",
             None if most is None else most <= TOKENS_RATIO_MOST),
    ]  # fmt: skip


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _at_least(name: str, value: float | None, target: float) -> Goal:
    return Goal(name, value, f">= {target:g}", None if value is None else value >= target)


def _judge(name: str, wtl: str, counts: bool) -> Goal:
    """'wins/ties/losses': met when losses <= wins; not measured by a judge that failed its controls."""
    if not wtl:
        return Goal(name, None, "losses <= wins", None)
    if not counts:
        return Goal(name, f"{wtl} (judge without passing controls)", "losses <= wins", None)
    wins, _, losses = (int(x) for x in wtl.split("/"))
    return Goal(name, wtl, "losses <= wins", losses <= wins)


def markdown(goals: list[Goal]) -> str:
    lines = ["| goal | measured | target | met |", "|---|---|---|---|"]
    for g in goals:
        value = "-" if g.value is None else f"{g.value:.2f}" if isinstance(g.value, float) else g.value
        met = "not measured" if g.met is None else "yes" if g.met else "**no**"
        lines.append(f"| {g.name} | {value} | {g.target} | {met} |")
    return "\n".join(lines) + "\n"
