"""One decode step's clock and its record: what the policy's ledgers and the step log read.

Wall-clock times are what a step costs only where the host waits for the forwards (CPU).
On an asynchronous device (a GPU) each stage also records a device event, and a step's
outcome reaches the policy once the device has passed its events (`device_times.py`), with
the device's times; without events, wall-clock times are kept for the log but teach nothing
(`StepOutcome.timed`).
"""

from __future__ import annotations

import logging
import time

from sglang_specsot.costs.cost_model import CostModel
from sglang_specsot.speculative.device_times import DeviceStepTimes, StepEvents
from sglang_specsot.speculative.drafters import Proposal
from sglang_specsot.speculative.policy.values import StepOutcome, Verified
from sglang_specsot.speculative.step_log import StepLog, StepRecord
from sglang_specsot.speculative.trace import TraceWriter, steps_of

logger = logging.getLogger(__name__)
_COST_LOG_EVERY = 2000  # steps between the cost model's log lines


class StepClock:
    """The times of one step's stages, and the drafter's catch-ups when it began."""

    def __init__(self, catch_ups: int, device_times: DeviceStepTimes | None = None):
        self.catch_ups = catch_ups
        self.device_times = device_times
        self.marks = {"start": time.perf_counter()}
        self.events = {} if device_times is None else {"start": device_times.event()}
        self.target_ms = 0.0  # the target's verify forward, set by verify
        self.target_rows = 0  # its rows (requests x verify width), set by verify

    def mark(self, stage: str) -> None:
        self.marks[stage] = time.perf_counter()
        if self.device_times is not None:
            self.events[stage] = self.device_times.event()

    def step_events(self) -> StepEvents:
        e = self.events
        return StepEvents(e["start"], e["target_start"], e["target_end"], e["draft_extend"])

    def ms(self, stage: str, since: str) -> float:
        return (self.marks[stage] - self.marks[since]) * 1e3


class Telemetry:
    """Step clocks, the outcome each step hands the policy, and the optional step log."""

    def __init__(self, cost: CostModel, timed: bool, device_times: DeviceStepTimes | None = None):
        self.cost = cost
        self.timed = timed
        self.device_times = None if timed else device_times  # the host's clock where it waits
        self.steps = 0
        self.step_log = StepLog.from_env()  # SGLANG_SPECSOT_STEP_LOG: one JSON line per step
        self.trace = TraceWriter.from_env()  # SGLANG_SPECSOT_TRACE: one JSON line per request and step

    def start(self, catch_ups: int) -> StepClock:
        return StepClock(catch_ups, self.device_times)

    def finish(self, clock: StepClock, proposal: Proposal, width: int, verified: Verified, extended: bool, drafter,
               accept_lens: list[int]) -> list[StepOutcome]:  # fmt: skip
        """The outcomes the policy may learn from now: this step's where the host waited for
        it, else the earlier steps whose device events have completed (their verify forwards
        teach the target's cost model here). The step log records this step either way, from
        the accept lengths the host already read (`accept_lens`): it adds no read of its own."""
        self.steps += 1
        if self.steps % _COST_LOG_EVERY == 0:
            logger.info("SPECSOT cost model after %d steps: %s", self.steps, self.cost.info())
        outcome = StepOutcome(
            decision=proposal.decision, ms=clock.ms("draft_extend", "start"),
            committed=verified.committed, priced_width=proposal.priced_width(width), drafted=width > 1,
            extended_on_plain_step=extended, timed=self.timed, caught_up=drafter.catch_ups != clock.catch_ups,
        )  # fmt: skip
        if self.step_log is not None:
            self.step_log.write(self._record(clock, outcome, proposal, width, accept_lens, drafter.step_log_fields(proposal)))
        if self.device_times is None:
            return [outcome]
        self.device_times.push(outcome, clock.target_rows, clock.step_events())
        ready = self.device_times.ready()
        for step in ready:
            self.cost.target.observe(step.target_rows, step.target_ms)
        return [step.outcome for step in ready]

    def trace_step(self, reqs, proposal: Proposal, width: int, committed) -> None:
        """The step's trees and accepted paths into the trace, if one is written: from the
        committed tokens the host already read (`host_sync.Committed`), no read of its own."""
        if self.trace is not None:
            rids = [req.rid for req in reqs]
            self.trace.write(steps_of(rids, proposal.trees, width, committed.rows, committed.lens))

    def info(self) -> dict | None:
        """Device timing's state for /server_info (None where the host's clock times steps)."""
        times = self.device_times
        return None if times is None else {"pending_steps": len(times.pending), "dropped_steps": times.dropped}

    def _record(self, clock: StepClock, outcome: StepOutcome, proposal: Proposal, width: int, accept_lens: list[int],
                fields: dict) -> StepRecord:  # fmt: skip
        decision, trees = outcome.decision, proposal.trees
        accepted = [min(k - 1, t.height) for k, t in zip(accept_lens, trees)]
        plan = decision.plan if decision.adaptive else None
        phases = {
            "draft": clock.ms("draft", "start"), "verify": clock.ms("verify", "draft"),
            "draft_extend": clock.ms("draft_extend", "verify"),
        }  # fmt: skip
        phases = {k: round(v, 3) for k, v in phases.items()} | {"target_forward": round(clock.target_ms, 3)}
        return StepRecord(
            step=self.steps, bs=len(trees), ps=None if plan is None else [round(p, 4) for p in decision.ps],
            firsts=None if plan is None else [round(p, 4) for p in decision.firsts],
            width=width,
            budgets=[t.size - 1 for t in trees] if plan is None else list(plan.budgets),
            drafted=[t.size - 1 for t in trees], accepted=accepted,
            expected_tokens=None if plan is None else round(plan.expected_tokens, 4),
            expected_ms=None if plan is None else round(plan.step_ms, 3),
            explored=decision.exploring, draft_source=proposal.source, step_ms=round(outcome.ms, 3),
            candidates=None if plan is None else decision.candidates, first_draft_q=fields["first_draft_q"],
            cost={"target_overhead_ms": round(self.cost.target.overhead_ms, 3), **fields["cost"]},
            draft_extend=fields["draft_extend"], phase_ms=phases,
        )  # fmt: skip
