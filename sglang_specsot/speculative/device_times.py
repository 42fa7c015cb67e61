"""A step's cost on an asynchronous device, from its events, without waiting for them.

On a GPU under the overlap scheduler the host runs ahead of the device: a step's wall clock
is host time, not what the step cost. Each step records device events instead (its start,
its verify forward's start and end, its end) on the stream that runs it, and the step's
times are read once the device has passed its end event (`Event.query()`, no sync), one or
a few steps later. The budget policy then learns from them exactly as it learns from a CPU's
wall clock, late by those few steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from sglang_specsot.speculative.policy.values import StepOutcome

MAX_PENDING = 64  # steps whose events the device has not passed yet; older ones are dropped


@dataclass(frozen=True)
class StepEvents:
    """One step's device events (each with `record()`, `query()`, `elapsed_time(other)`)."""

    start: object
    target_start: object
    target_end: object
    end: object


@dataclass(frozen=True)
class TimedStep:
    """A step whose events the device has passed: its outcome, with the device's times."""

    outcome: StepOutcome
    target_rows: int
    target_ms: float


class DeviceStepTimes:
    """Steps waiting for their device events, handed back in order once complete."""

    def __init__(self, new_event: Callable[[], object]):
        self.new_event = new_event  # a recorded-on-demand timing event of the worker's device
        self.pending: deque[tuple[StepOutcome, int, StepEvents]] = deque()
        self.dropped = 0

    def event(self) -> object:
        event = self.new_event()
        event.record()
        return event

    def push(self, outcome: StepOutcome, target_rows: int, events: StepEvents) -> None:
        if len(self.pending) == MAX_PENDING:
            self.pending.popleft()
            self.dropped += 1
        self.pending.append((outcome, target_rows, events))

    def ready(self) -> list[TimedStep]:
        """The oldest steps whose end event the device has passed, with their times (ms)."""
        done = []
        while self.pending and self.pending[0][2].end.query():
            outcome, rows, ev = self.pending.popleft()
            step_ms = ev.start.elapsed_time(ev.end)
            done.append(TimedStep(replace(outcome, ms=step_ms, timed=True), rows, ev.target_start.elapsed_time(ev.target_end)))
        return done


def cuda_timing_event() -> object:
    """A CUDA timing event (records on the current stream: the step's)."""
    import torch

    return torch.cuda.Event(enable_timing=True)
