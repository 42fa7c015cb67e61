"""What server-side SoT prices an answer by in the HTTP process (serving/costs.py): the
scheduler's curve, refreshed from SGLang's timed decode steps, and its load."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from sglang_specsot.serving import costs
from sglang_specsot.serving.costs import ServerCosts, StepWindow
from sglang_specsot.sot.latency import RowCosts, ServerLoad

CURVE = {"probe_rows": [1, 8], "probe_ms": [100.0, 120.0], "overhead_ms": 0.0, "observed_steps": 0}


class _TokenizerManager:
    def __init__(self, report: dict | None = CURVE, key: bool = True, algorithm: str | None = None) -> None:
        self.server_args = SimpleNamespace(speculative_algorithm=algorithm)
        self.report, self.key, self.asked = report, key, 0
        self.moments: list[float] | None = None
        self.delay = 0.0

    async def get_internal_state(self):
        self.asked += 1
        await asyncio.sleep(self.delay)
        return [{"specsot_row_costs": self.report} if self.key else {}]

    async def get_loads(self):
        return [SimpleNamespace(num_running_reqs=3, num_waiting_reqs=1, max_running_requests=16,
                                decode_moments=self.moments)]  # fmt: skip


def _curve(server: ServerCosts):
    return asyncio.run(server.curve())


def test_the_curve_is_the_schedulers_and_is_fetched_once_until_stale(monkeypatch):
    tm = _TokenizerManager()
    server = ServerCosts(tm)
    curve, why = _curve(server)
    assert curve == RowCosts((1, 8), (100.0, 120.0), 0.0, "start-up probe") and why == ""
    _curve(server)
    assert tm.asked == 1
    monkeypatch.setattr(costs, "REFRESH_S", -1.0)
    _curve(server)
    assert tm.asked == 2


@pytest.mark.parametrize(
    ("tm", "why"),
    [(_TokenizerManager(None), "probe could not time"), (_TokenizerManager(key=False), "plugin loaded")],
    ids=["probe-failed", "no-plugin"],
)
def test_an_unknown_curve_says_why(tm, why):
    curve, reason = _curve(ServerCosts(tm))
    assert curve is None and why in reason


def test_a_slow_scheduler_does_not_hold_the_request_and_its_answer_lands_later(monkeypatch):
    monkeypatch.setattr(costs, "FIRST_FETCH_S", 0.01)
    tm = _TokenizerManager()
    tm.delay = 0.2

    async def scenario():
        server = ServerCosts(tm)
        first = await server.curve()
        started = asyncio.get_running_loop().time()
        second = await server.curve()  # does not wait again
        waited = asyncio.get_running_loop().time() - started
        await asyncio.sleep(0.3)
        return first, second, waited, await server.curve()

    (curve, why), (second, _), waited, (later, _) = asyncio.run(scenario())
    assert curve is None and second is None and "not answered yet" in why and waited < 0.1
    assert later is not None and tm.asked == 1


def test_the_load_is_the_schedulers_snapshot():
    assert asyncio.run(ServerCosts(_TokenizerManager()).load()) == (ServerLoad(3, 1, 16), "")

    class _NoSnapshots(_TokenizerManager):
        async def get_loads(self):
            raise AttributeError("'NoneType' object has no attribute 'read_all'")

    load, why = asyncio.run(ServerCosts(_NoSnapshots()).load())
    assert load is None and "no load snapshot" in why


def test_a_plain_servers_overhead_comes_from_its_timed_decode_steps():
    tm = _TokenizerManager()
    server = ServerCosts(tm)
    _curve(server)
    for totals in ([10, 20, 2_000_000], [50, 100, 8_000_000]):  # 40 steps of 2 rows, 150 ms each
        tm.moments = totals
        asyncio.run(server.load())
    curve, _ = _curve(server)
    assert curve.overhead_ms == pytest.approx(150.0 - 100.0 - 20.0 / 7)
    assert "decode steps" in curve.source
    speculative = ServerCosts(_TokenizerManager(algorithm="SPECSOT"))  # its steps are verifies: not used
    speculative.steps.update([0, 0, 0])
    speculative.steps.update([40, 80, 6_000_000])
    assert _curve(speculative)[0].overhead_ms == 0.0


def test_a_step_window_needs_enough_steps_and_survives_a_restart():
    window = StepWindow(min_steps=10)
    window.update(None)
    window.update([5, 5, 500_000])
    window.update([9, 9, 900_000])
    assert window.mean is None
    window.update([15, 25, 2_500_000])
    assert window.mean == (2.0, 200.0)
    window.update([1, 1, 100_000])  # counters went back: the scheduler restarted
    window.update([20, 20, 2_000_000])
    assert window.mean == (1.0, 100.0)
