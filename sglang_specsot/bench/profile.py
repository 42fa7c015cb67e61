"""Where a SoT answer's time goes: skeleton, branch phase, and what is left (merge, HTTP), with
how much the branches overlapped and how fast the batch decoded against plain decoding.

A speed-up over plain decoding factors into (plain's tokens/s -> the branch phase's tokens/s:
what batching the branches buys on this hardware) x (plain's tokens / the branches' tokens:
answering more or less) / (the time outside the branch phase); this table shows each factor.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from sglang_specsot.bench.configs import BASELINE
from sglang_specsot.bench.store import OK, CellResult


@dataclass(frozen=True, slots=True)
class Profile:
    """Means over one configuration's SoT-path cells on one subset (seconds or ratios)."""

    config: str
    subset: str
    n: int
    latency_s: float
    skeleton_share: float  # skeleton seconds / complete-answer seconds
    branch_share: float  # first branch start -> last branch end, over the complete answer
    other_share: float  # the rest: parse, merge, HTTP
    overlap: float  # sum of branch durations / branch phase: branches decoding at once
    longest_over_phase: float  # longest branch / branch phase (1.0: one branch sets the time)
    branch_tok_s: float  # branch tokens / branch phase seconds
    plain_tok_s: float | None  # plain decoding's tokens/s on the same questions
    tokens_vs_plain: float | None  # SoT answer's output tokens / plain's (skeleton included)


def profiles(cells: dict[tuple[int, str], CellResult], subsets: dict) -> list[Profile]:
    """A Profile for every configuration x subset with SoT-path cells that have branches."""
    names = dict.fromkeys(name for _, name in sorted(cells))
    out = []
    for name in names:
        for subset, keep in subsets.items():
            mine = [c for (_, n), c in cells.items() if n == name and c.status == OK and c.path == "sot"
                    and c.branches and keep(c)]  # fmt: skip
            if mine:
                out.append(_profile(name, subset, mine, cells))
    return out


def _profile(name: str, subset: str, mine: list[CellResult], cells) -> Profile:
    rows = [_one(c, cells.get((c.question_id, BASELINE))) for c in mine]
    mean = lambda k: statistics.fmean(r[k] for r in rows)  # noqa: E731
    known = lambda k: [r[k] for r in rows if r[k] is not None]  # noqa: E731
    return Profile(name, subset, len(rows), mean("latency"), mean("skeleton"), mean("phase"), mean("other"),
                   mean("overlap"), mean("longest"), mean("branch_tok_s"),
                   statistics.fmean(known("plain_tok_s")) if known("plain_tok_s") else None,
                   statistics.fmean(known("tokens")) if known("tokens") else None)  # fmt: skip


def _one(cell: CellResult, base: CellResult | None) -> dict:
    start = min(b.start for b in cell.branches)
    end = max(b.end for b in cell.branches)
    phase = max(end - start, 1e-9)
    total = max(cell.latency, 1e-9)
    skeleton = cell.skeleton_seconds or 0.0
    plain = base if base is not None and base.status == OK else None
    return {
        "latency": cell.latency, "skeleton": skeleton / total, "phase": phase / total,
        "other": max(total - skeleton - phase, 0.0) / total,
        "overlap": sum(b.end - b.start for b in cell.branches) / phase,
        "longest": max(b.end - b.start for b in cell.branches) / phase,
        "branch_tok_s": sum(b.tokens for b in cell.branches) / phase,
        "plain_tok_s": plain.tokens_per_s if plain else None,
        "tokens": cell.output_tokens / plain.output_tokens if plain and plain.output_tokens else None,
    }  # fmt: skip


COLUMNS = [("config", "config"), ("subset", "subset"), ("n", "n"), ("latency_s", "mean s"),
           ("skeleton_share", "skeleton"), ("branch_share", "branch phase"), ("other_share", "other"),
           ("overlap", "branches at once"), ("longest_over_phase", "longest / phase"),
           ("branch_tok_s", "branch tok/s"), ("plain_tok_s", "plain tok/s"), ("tokens_vs_plain", "tokens / plain")]  # fmt: skip


def markdown(rows: list[Profile]) -> str:
    lines = ["| " + " | ".join(t for _, t in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        data = asdict(row)
        lines.append("| " + " | ".join("-" if data[k] is None else f"{data[k]:.2f}" if isinstance(data[k], float)
                                       else str(data[k]) for k, _ in COLUMNS) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"
