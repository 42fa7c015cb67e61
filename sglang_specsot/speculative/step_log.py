"""A per-step log of SPECSOT's budget policy, for diagnosing what it chose and why.

With `SGLANG_SPECSOT_STEP_LOG=/path/steps.jsonl` in the server's environment, every decode
step appends one JSON line: the batch size, each request's acceptance estimates (of its first
draft, and of a later draft given its parent was), the plan (verify width, budgets, expected
tokens and ms), whether it explored, where the first draft token came from, what verify
accepted, the step's wall-clock time, and the cost model's learned overheads and the draft
model's deferred-extend counters at that point, the time of each phase (draft, verify, the
target's forward, draft-extend), and every candidate width's expected tokens and ms, so a
choice can be checked against what the steps really cost (`examples/step_log_report.py`
summarises a log). Off by default; on, it reads nothing more from the device than the step
already does (the accept lengths come with the committed tokens, `host_sync.Committed`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from sglang_specsot.speculative.jsonl import JsonLinesFile

ENV = "SGLANG_SPECSOT_STEP_LOG"


@dataclass(frozen=True)
class StepRecord:
    """One decode step, as the policy saw it and as it turned out."""

    step: int
    bs: int
    ps: list[float] | None  # acceptance of a draft given its parent was (None: adaptive budgets off)
    firsts: list[float] | None  # running acceptance of each request's first draft
    width: int  # verify window per request, incl. the bonus row
    budgets: list[int]  # draft tokens each request was allowed
    drafted: list[int]  # draft tokens each request's tree really held
    accepted: list[int]  # drafts accepted per request (accept length - 1)
    expected_tokens: float | None
    expected_ms: float | None
    explored: bool
    draft_source: str  # where the first draft token came from: context, extend, catch_up
    step_ms: float  # draft + verify + draft-extend, wall clock: the host's milliseconds of the step
    # What the policy weighed, by verify width: [expected tokens, expected ms] (adaptive only).
    candidates: dict[str, list[float]] | None
    first_draft_q: list[float] | None  # the draft model's top-1 probability of its first draft
    cost: dict  # the cost model's learned overheads at this step (ms)
    draft_extend: dict | None  # the deferred-extend counters (draft model, adaptive chains)
    # Wall clock of the step's phases (ms): draft, verify (of which target_forward: the
    # target's forward alone) and draft_extend, to see where a step's time went.
    phase_ms: dict


class StepLog(JsonLinesFile):
    """Appends StepRecords as JSON lines to the file SGLANG_SPECSOT_STEP_LOG names."""

    ENV = ENV

    def write(self, record: StepRecord) -> None:
        self.write_lines([json.dumps(asdict(record))])
