"""The issue's goals, checked against a report's summary rows (suitable questions unless said).

SpecSoT >= 3.0x plain decoding, >= 1.5x the best speculative-only configuration and >= 1.5x
SoT alone on the same route, at quality parity (the SoT answer covers >= 0.9 of the normal
answer's sentences, and the judge's losses do not exceed its wins); the router brings no
slowdown on unsuitable questions. Ratios between two configurations are ratios of their
geometric-mean speed-ups over plain decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_specsot.bench.configs import SAMPLED
from sglang_specsot.bench.report import Row

VS_PLAIN, VS_SPEC, VS_SOT, MIN_COVERAGE = 3.0, 1.5, 1.5, 0.9
# Issue #10's quality bar: no question's answer below this coverage, loop-ended branches
# under this share, and no skeleton with code or a repeated point.
WORST_COVERAGE, MAX_BRANCH_LOOPS = 0.6, 0.05
SPEC_ONLY = ("NGRAM", "SPECSOT-ctx", "STANDALONE", "SPECSOT")
SOT_ALONE = {"SpecSoT-server": "SoT-server", "SpecSoT-frontend": "SoT-frontend"}
ROUTER = "SpecSoT-router"


@dataclass(frozen=True, slots=True)
class Goal:
    name: str
    value: float | str | None  # None: not measured (yet)
    target: str
    met: bool | None  # None: not measured


def check(rows: list[Row]) -> list[Goal]:
    """One Goal per (SpecSoT configuration, criterion), then the router's."""
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
        goals.append(_judge(f"{name} judge (calibrated)", row.judge_calibrated if row else ""))
        goals.append(_judge(f"{name} judge (both orders agree)", row.judge if row else ""))
    router = by.get((ROUTER, "unsuitable"))
    goals.append(_at_least(f"{ROUTER} vs plain on unsuitable questions", router.speedup if router else None, 1.0))
    return goals


def coverage_ceiling(rows: list[Row]) -> str | None:
    """What the coverage goal is measured against: how much of the greedy normal answer a
    second normal answer of the same model (sampled, `plain-sampled`) covers on the suitable
    questions; None when the run has no such cells."""
    row = next((r for r in rows if r.config == SAMPLED and r.subset == "suitable"), None)
    if row is None or row.normal_covered is None:
        return None
    return (
        f"Coverage ceiling: a second normal answer ({SAMPLED}) covers {row.normal_covered:.2f} of the "
        f"greedy normal answer on the {row.ok} suitable questions (worst question {row.min_normal_covered:.2f}); "
        f"a SoT answer that covers as much is as close to the normal answer as the model's own answers "
        f"are to each other."
    )


def _quality(name: str, row: Row | None) -> list[Goal]:
    worst = row.min_normal_covered if row else None
    loops = row.branch_loops if row else None
    flawed = row.flawed_skeletons if row else None
    return [
        _at_least(f"{name} worst question covers the normal answer", worst, WORST_COVERAGE),
        Goal(f"{name} loop-ended branches", loops, f"< {MAX_BRANCH_LOOPS:g}", None if loops is None else loops < MAX_BRANCH_LOOPS),
        Goal(f"{name} skeletons with code or repeated points", flawed, "0", None if flawed is None else flawed == 0),
    ]  # fmt: skip


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _at_least(name: str, value: float | None, target: float) -> Goal:
    return Goal(name, value, f">= {target:g}", None if value is None else value >= target)


def _judge(name: str, wtl: str) -> Goal:
    """'wins/ties/losses': met when losses <= wins."""
    if not wtl:
        return Goal(name, None, "losses <= wins", None)
    wins, _, losses = (int(x) for x in wtl.split("/"))
    return Goal(name, wtl, "losses <= wins", losses <= wins)


def markdown(goals: list[Goal]) -> str:
    lines = ["| goal | measured | target | met |", "|---|---|---|---|"]
    for g in goals:
        value = "-" if g.value is None else f"{g.value:.2f}" if isinstance(g.value, float) else g.value
        met = "not measured" if g.met is None else "yes" if g.met else "**no**"
        lines.append(f"| {g.name} | {value} | {g.target} | {met} |")
    return "\n".join(lines) + "\n"
