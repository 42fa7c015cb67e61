"""Summarise a SPECSOT step log (SGLANG_SPECSOT_STEP_LOG): what the budget policy chose, by
batch size, and what those steps really cost and brought.

    SGLANG_SPECSOT_STEP_LOG=/tmp/steps.jsonl python -m sglang.launch_server ... --speculative-adaptive
    python examples/step_log_report.py /tmp/steps.jsonl

Per batch-size bucket: steps, share of plain steps (verify width 1) and of exploring steps,
committed tokens per step, real ms per plain and per drafting step against what the cost model
expected for them, real tokens/s against the plain steps' own, acceptance of the drafts, the
mean acceptance estimate on plain and on drafting steps, how long runs of plain steps last,
and (logs that have them) the mean time of each phase of a plain and of a drafting step.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

BUCKETS = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 1 << 30))


def bucket(bs: int) -> str:
    for lo, hi in BUCKETS:
        if lo <= bs <= hi:
            return str(lo) if lo == hi else f"{lo}-{hi}" if hi < 1 << 30 else f">={lo}"
    raise ValueError(f"batch size {bs} < 1")


def _mean(xs) -> float | None:
    xs = list(xs)
    return round(statistics.fmean(xs), 3) if xs else None


def summarise(records: list[dict]) -> dict[str, dict]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        groups[bucket(r["bs"])].append(r)
    return {name: _summary(rs) for name, rs in sorted(groups.items(), key=lambda kv: min(r["bs"] for r in kv[1]))}


def _summary(rs: list[dict]) -> dict:
    plain = [r for r in rs if r["width"] == 1]
    drafting = [r for r in rs if r["width"] > 1]
    tokens = [r["bs"] + sum(r["accepted"]) for r in rs]
    total_ms = sum(r["step_ms"] for r in rs)
    plain_rate = sum(r["bs"] for r in plain) / sum(r["step_ms"] for r in plain) * 1e3 if plain else None
    drafted = sum(sum(r["drafted"]) for r in drafting)
    return {
        "steps": len(rs),
        "plain_share": round(len(plain) / len(rs), 3),
        "explored_share": round(sum(r["explored"] for r in rs) / len(rs), 3),
        "tokens_per_step": _mean(tokens),
        "tok_per_s": round(sum(tokens) / total_ms * 1e3, 2) if total_ms else None,
        "plain_steps_tok_per_s": None if plain_rate is None else round(plain_rate, 2),
        "plain_ms": _mean(r["step_ms"] for r in plain),
        "plain_expected_ms": _mean(r["expected_ms"] for r in plain if r["expected_ms"] is not None),
        "drafting_ms": _mean(r["step_ms"] for r in drafting),
        "drafting_expected_ms": _mean(r["expected_ms"] for r in drafting if r["expected_ms"] is not None),
        "drafting_ms_by_source": {
            src: _mean(r["step_ms"] for r in drafting if r["draft_source"] == src)
            for src in sorted({r["draft_source"] for r in drafting})
        },
        "drafts_per_drafting_step": _mean(sum(r["drafted"]) / r["bs"] for r in drafting),
        "accepted_per_draft": round(sum(sum(r["accepted"]) for r in drafting) / drafted, 3) if drafted else None,
        "mean_p_plain": _mean(statistics.fmean(r["ps"]) for r in plain if r["ps"]),
        "mean_p_drafting": _mean(statistics.fmean(r["ps"]) for r in drafting if r["ps"]),
        # The first draft's estimate (logs without first-draft estimates have none).
        "mean_first_plain": _mean(statistics.fmean(r["firsts"]) for r in plain if r.get("firsts")),
        "mean_first_drafting": _mean(statistics.fmean(r["firsts"]) for r in drafting if r.get("firsts")),
        "plain_run_lengths": _runs([r["width"] == 1 for r in rs]),
        "overheads_last": rs[-1]["cost"],
        "plain_phase_ms": _phases(plain),
        "drafting_phase_ms": _phases(drafting),
    }


def _phases(rs: list[dict]) -> dict | None:
    """Mean ms of each step phase (draft, verify, target_forward, draft_extend), where logged."""
    logged = [r["phase_ms"] for r in rs if r.get("phase_ms")]
    return {k: _mean(p[k] for p in logged) for k in logged[0]} if logged else None


def _runs(flags: list[bool]) -> dict:
    """Lengths of consecutive plain steps: how long the policy stays plain once it goes."""
    runs, n = [], 0
    for plain in flags + [False]:
        if plain:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    if not runs:
        return {"runs": 0}
    return {"runs": len(runs), "median": statistics.median(runs), "max": max(runs)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="the JSON-lines file SGLANG_SPECSOT_STEP_LOG named")
    args = parser.parse_args(argv)
    with open(args.log) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if not records:
        raise SystemExit(f"{args.log}: no steps logged")
    print(json.dumps(summarise(records), indent=1))


if __name__ == "__main__":
    main()
