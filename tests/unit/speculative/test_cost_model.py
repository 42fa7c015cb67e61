"""The cost model interpolates the probe and learns the overhead (a + b * rows) from real steps."""

from __future__ import annotations

import pytest

from sglang_specsot.speculative.cost_model import CostModel, ForwardCost


def _flat_then_linear() -> ForwardCost:
    # A bf16 CPU: flat to 32 rows, then linear.
    return ForwardCost(probe_rows=(1, 8, 32, 64), probe_ms=(10.0, 10.0, 10.0, 20.0))


def test_interpolates_and_extends_the_last_slope():
    cost = _flat_then_linear()
    assert cost.ms(1) == cost.ms(32) == 10.0
    assert cost.ms(48) == pytest.approx(15.0)
    assert cost.ms(128) == pytest.approx(40.0)


def test_a_single_probe_scales_with_rows_beyond_it():
    cost = ForwardCost(probe_rows=(4,), probe_ms=(8.0,))
    assert cost.ms(1) == 8.0 and cost.ms(8) == 16.0


def test_overhead_is_set_by_the_first_step_then_follows_a_decayed_mean():
    cost = ForwardCost(probe_rows=(1, 32), probe_ms=(10.0, 10.0), alpha=0.5)
    cost.observe(rows=4, ms=110.0)
    assert cost.overhead_ms == pytest.approx(100.0) and cost.ms(1) == pytest.approx(110.0)
    cost.observe(rows=4, ms=50.0)  # residuals 100 (weight 0.5) and 40 (weight 1)
    assert cost.overhead_ms == pytest.approx(60.0) and cost.overhead_per_row_ms == 0.0
    cost.observe(rows=4, ms=1.0)  # faster than the probe: the overhead falls, never below 0
    assert cost.overhead_ms == pytest.approx((25.0 + 20.0 + 0.0) / 1.75)
    assert cost.info()["observed_steps"] == 3


def test_overhead_that_grows_with_rows_is_learned_as_a_slope():
    # Attention over the cached context costs per row: a plain step of 4 rows and a verify of
    # 8 rows differ by more than the probe (flat here) says.
    cost = ForwardCost(probe_rows=(1, 32), probe_ms=(100.0, 100.0), alpha=0.1)
    for _ in range(30):
        cost.observe(rows=4, ms=100.0 + 40.0 + 4 * 20.0)
        cost.observe(rows=8, ms=100.0 + 40.0 + 8 * 20.0)
    assert cost.overhead_ms == pytest.approx(40.0) and cost.overhead_per_row_ms == pytest.approx(20.0)
    assert cost.ms(16) == pytest.approx(100.0 + 40.0 + 16 * 20.0)
    # A run of plain steps (one row count): the steps' own cost is refitted exactly, and the
    # slope, no longer identifiable, stays near what the mixed steps showed.
    for _ in range(60):
        cost.observe(rows=4, ms=100.0 + 10.0 + 4 * 20.0)
    assert cost.ms(4) == pytest.approx(100.0 + 10.0 + 4 * 20.0, abs=0.5)
    assert cost.overhead_per_row_ms == pytest.approx(20.0, rel=0.2)
    assert cost.info()["overhead_per_row_ms"] == pytest.approx(cost.overhead_per_row_ms, abs=1e-4)


def test_the_fitted_overhead_never_goes_negative():
    cost = ForwardCost(probe_rows=(1, 32), probe_ms=(10.0, 10.0), alpha=0.5)
    cost.observe(rows=1, ms=60.0)  # residual 50 at 1 row
    cost.observe(rows=16, ms=12.0)  # residual 2 at 16 rows: a falling line
    assert cost.overhead_per_row_ms == 0.0 and cost.overhead_ms >= 0.0
    cost.observe(rows=2, ms=10.0)
    cost.observe(rows=30, ms=10.0 + 300.0)  # through the origin: intercept 0, slope positive
    assert cost.overhead_ms >= 0.0 and cost.overhead_per_row_ms > 0.0


def test_step_with_a_draft_model_adds_its_steps_and_extend():
    target = ForwardCost(probe_rows=(1, 64), probe_ms=(10.0, 10.0))
    draft = ForwardCost(probe_rows=(1, 64), probe_ms=(4.0, 4.0))
    cost = CostModel(target, draft)
    assert cost.step_ms(bs=2, width=5, draft_steps=4) == pytest.approx(10.0 + 4 * 4.0 + 4.0)
    assert CostModel(target).step_ms(bs=2, width=5, draft_steps=4) == 10.0
    # A plain step whose draft-extend is deferred costs the target's forward alone.
    assert cost.step_ms(bs=2, width=1, draft_extend=False) == 10.0
    assert set(cost.info()) == {"target", "draft"}


def test_probe_rows_must_increase():
    with pytest.raises(AssertionError):
        ForwardCost(probe_rows=(8, 4), probe_ms=(1.0, 1.0))
