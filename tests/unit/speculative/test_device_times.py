"""Step costs from device events (a GPU under overlap): read once the device has passed them,
never by waiting, and fed to the policy and the target's cost model as a CPU's wall clock is."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang_specsot.speculative.device_times import MAX_PENDING, DeviceStepTimes
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.drafters import Proposal
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.values import Verified
from sglang_specsot.speculative.telemetry import Telemetry
from tests.unit.speculative.builders import batch, context_worker, cost, decide


class FakeDevice:
    """A device clock: events record the time they were queued at, and complete once the
    device has run past them (`run_until`)."""

    def __init__(self):
        self.queued_ms, self.done_ms = 0.0, 0.0

    def event(self):
        device = self

        class Event:
            def record(self):
                self.at = device.queued_ms

            def query(self):
                return device.done_ms >= self.at

            def elapsed_time(self, other):
                return other.at - self.at

        return Event()


def _step(telemetry: Telemetry, device: FakeDevice, worker, stages_ms=(2.0, 5.0, 30.0, 3.0)):
    """One step whose draft, verify-forward launch, forward and draft-extend take `stages_ms`
    of device time."""
    clock = telemetry.start(0)
    for stage, ms in zip(("draft", "target_start", "target_end", "draft_extend"), stages_ms):
        device.queued_ms += ms
        clock.mark(stage)
    clock.mark("verify")
    clock.target_rows = 4
    trees = (DraftTree((1, 2), (-1, 0)),)
    result = SimpleNamespace(speculative_num_draft_tokens=2, accept_lens=torch.tensor([2]))
    proposal = Proposal(trees, "context", decide(worker, batch(1)))
    return telemetry.finish(clock, proposal, result.speculative_num_draft_tokens, Verified((1,), (1,), "context", committed=2), False, worker.drafter, [2])


def test_step_times_come_from_device_events_once_the_device_passed_them():
    device = FakeDevice()
    worker = context_worker(AdaptiveConfig.default(3), cost((1, 64), (10.0, 10.0)))
    telemetry = Telemetry(worker.cost, timed=False, device_times=DeviceStepTimes(device.event))
    assert _step(telemetry, device, worker) == []  # the device is still on it: nothing waits
    assert _step(telemetry, device, worker) == []
    device.done_ms = 40.0  # past the first step's end only
    (first,) = _step(telemetry, device, worker)
    assert first.timed and first.ms == 40.0  # 2 + 5 + 30 + 3 ms of device time
    assert worker.cost.target.observed == 1  # its verify forward: 30 ms for 4 rows
    device.done_ms = device.queued_ms  # past steps 2 and 3; step 4 is queued after
    later = _step(telemetry, device, worker)
    assert [o.ms for o in later] == [40.0, 40.0] and telemetry.info()["pending_steps"] == 1


def test_steps_the_device_never_reports_are_dropped_not_kept():
    device = FakeDevice()
    worker = context_worker(AdaptiveConfig.default(3), cost((1, 64), (10.0, 10.0)))
    telemetry = Telemetry(worker.cost, timed=False, device_times=DeviceStepTimes(device.event))
    for _ in range(MAX_PENDING + 5):
        _step(telemetry, device, worker)
    assert telemetry.info() == {"pending_steps": MAX_PENDING, "dropped_steps": 5}


def test_where_the_host_waits_its_clock_times_the_step():
    worker = context_worker(AdaptiveConfig.default(3), cost((1, 64), (10.0, 10.0)))
    telemetry = Telemetry(worker.cost, timed=True, device_times=DeviceStepTimes(FakeDevice().event))
    assert telemetry.device_times is None and telemetry.info() is None
    (outcome,) = _step(telemetry, FakeDevice(), worker)
    assert outcome.timed
