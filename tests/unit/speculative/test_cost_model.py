"""The cost model interpolates the probe and learns the rows-independent overhead from real steps."""

from __future__ import annotations

import pytest

from sglang_specsot.costs.cost_model import CostModel, ForwardCost, StepCostTable


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


def test_overhead_is_set_by_the_first_step_then_follows_the_lower_median():
    cost = ForwardCost(probe_rows=(1, 32), probe_ms=(10.0, 10.0), window=3)
    cost.observe(rows=4, ms=110.0)
    assert cost.overhead_ms == pytest.approx(100.0) and cost.ms(1) == pytest.approx(110.0)
    cost.observe(rows=4, ms=50.0)
    assert cost.overhead_ms == pytest.approx(40.0)  # the lower of two
    cost.observe(rows=4, ms=1.0)  # faster than the probe: a residual of 0, never below
    assert cost.overhead_ms == pytest.approx(40.0)
    cost.observe(rows=4, ms=0.0)  # the window holds 3: the 110 ms step is gone
    assert cost.overhead_ms == 0.0 and cost.info()["observed_steps"] == 4


def test_a_one_off_slow_forward_does_not_move_the_overhead():
    # A shape's first forward on a CPU (oneDNN building its kernels) can take 10x the usual.
    cost = ForwardCost(probe_rows=(1, 32), probe_ms=(40.0, 40.0))
    for ms in (45.0, 44.0, 650.0, 46.0, 45.0, 900.0, 44.0):
        cost.observe(rows=1, ms=ms)
    assert cost.overhead_ms == pytest.approx(5.0)


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


def test_step_cost_table_answers_only_for_steps_seen_enough_and_lately():
    table = StepCostTable(window=4, min_seen=3, fresh_steps=5, max_keys=2)
    table.observe(4, 8, 700.0)
    table.observe(4, 8, 5000.0)  # a one-off slow step (a new shape's first forward)
    assert table.ms(4, 8) is None  # seen twice: not yet
    table.observe(4, 8, 780.0)
    assert table.ms(4, 8) == 780.0  # the lower median of 700, 780, 5000
    for _ in range(5):
        table.observe(1, 1, 200.0)
    assert table.ms(1, 1) == 200.0 and table.ms(4, 8) == 780.0
    table.observe(1, 1, 200.0)  # 6 steps since (4, 8) was seen: stale, the model answers again
    assert table.ms(4, 8) is None
    table.observe(2, 2, 300.0)  # a third key: the least recently seen one goes
    assert table.ms(4, 8) is None and (4, 8) not in table._times and table.info() == {"1x1": 200.0}


def test_the_cheapest_wider_step_bounds_a_narrower_ones_time():
    table = StepCostTable(window=4, min_seen=1)
    for width, ms in ((2, 139.0), (3, 124.0), (5, 134.0), (6, 131.0)):
        table.observe(1, width, ms)
    table.observe(4, 6, 100.0)  # another batch size bounds nothing here
    assert table.wider_ms(1, 1) == table.wider_ms(1, 2) == 124.0
    assert table.wider_ms(1, 3) == table.wider_ms(1, 4) == table.wider_ms(1, 5) == 131.0
    assert table.wider_ms(1, 6) is None and table.wider_ms(2, 1) is None


def test_a_model_that_has_not_run_borrows_its_priors_overhead_scaled():
    target = ForwardCost((1, 8), (100.0, 120.0))
    draft = ForwardCost((1, 8), (40.0, 50.0), prior=target, prior_share=0.5)
    target.observe(1, 180.0)  # the target's overhead: 80 ms
    assert draft.ms(1) == pytest.approx(40.0 + 40.0) and draft.info()["overhead_from_prior"]
    draft.observe(1, 50.0)  # its own first forward: 10 ms of overhead
    # The prior still counts as two forwards of the median: [10, 40, 40] -> 40.
    assert draft.ms(1) == pytest.approx(80.0) and "overhead_from_prior" not in draft.info()
    draft.observe(1, 50.0), draft.observe(1, 50.0)  # [10, 10, 10, 40, 40] -> 10
    assert draft.ms(1) == pytest.approx(50.0)


def test_one_slow_early_forward_does_not_set_a_models_overhead_alone():
    target = ForwardCost((1,), (100.0,), overhead_ms=60.0)
    draft = ForwardCost((1,), (40.0,), prior=target, prior_share=0.5, window=4)
    draft.observe(1, 40.0 + 100.0)  # a first forward building kernels: 100 ms unexplained
    assert draft.current_overhead_ms() == pytest.approx(30.0)  # the prior's, not 100
    for _ in range(4):
        draft.observe(1, 40.0 + 20.0)
    # The window is full of its own forwards: the prior no longer counts.
    assert draft.current_overhead_ms() == pytest.approx(20.0)
    assert ForwardCost((1,), (40.0,)).ms(1) == 40.0  # no prior: nothing added


def test_the_nearest_narrower_measured_step():
    table = StepCostTable(min_seen=1, max_keys=3)
    assert table.narrower(1, 4) is None
    table.observe(1, 1, 100.0)
    table.observe(1, 3, 250.0)
    table.observe(2, 1, 120.0)
    assert table.narrower(1, 4) == (3, 250.0) and table.narrower(1, 3) == (1, 100.0)
    assert table.narrower(1, 1) is None and table.narrower(2, 5) == (1, 120.0)
    table.observe(1, 2, 180.0)  # a fourth key: the oldest, (1, 1), is evicted
    assert table.narrower(1, 2) is None and table.narrower(1, 3) == (2, 180.0)


def test_a_probe_slower_than_the_real_forwards_is_scaled_down_to_them():
    # Probed while another process took the cores: 800 ms for one row where a real forward of
    # two rows takes 195. Interference only adds time, so the curve is scaled to the forwards.
    cost = ForwardCost(probe_rows=(1, 4, 8), probe_ms=(800.0, 1100.0, 1800.0), window=5)
    for _ in range(3):
        cost.observe(rows=2, ms=195.0)
    assert cost.overhead_ms == 0.0 and cost.scale == pytest.approx(195.0 / 900.0)
    assert cost.ms(2) == pytest.approx(195.0) and cost.ms(1) == pytest.approx(800.0 * 195.0 / 900.0)
    info = cost.info()
    assert info["probe_ms"] == [round(m * cost.scale, 3) for m in (800.0, 1100.0, 1800.0)]
    assert info["probe_ms_at_start_up"] == [800.0, 1100.0, 1800.0] and info["probe_scale"] == round(cost.scale, 4)
    # Once most recent forwards take longer than the curve, it is the probe's again, plus overhead.
    for _ in range(5):
        cost.observe(rows=2, ms=1000.0)
    assert cost.scale == 1.0 and cost.overhead_ms == pytest.approx(100.0)
    assert "probe_scale" not in cost.info() and cost.info()["probe_ms"] == [800.0, 1100.0, 1800.0]


def test_one_fast_forward_does_not_scale_a_sound_probe():
    cost = ForwardCost(probe_rows=(1, 8), probe_ms=(100.0, 120.0), window=5)
    for ms in (130.0, 60.0, 140.0):  # one forward timed oddly short among slower ones
        cost.observe(rows=1, ms=ms)
    assert cost.scale == 1.0 and cost.overhead_ms == pytest.approx(30.0)


def test_a_scaled_target_gives_the_draft_no_prior_overhead():
    target = ForwardCost(probe_rows=(1, 8), probe_ms=(800.0, 900.0))
    draft = ForwardCost(probe_rows=(1, 8), probe_ms=(20.0, 25.0), prior=target, prior_share=0.5)
    target.observe(rows=1, ms=100.0)
    assert target.scale < 1.0 and draft.current_overhead_ms() == 0.0


def test_a_table_that_skips_first_steps_counts_a_shape_from_its_second_step():
    table = StepCostTable(min_seen=3, skip_first=True)
    for ms in (900.0, 140.0, 150.0):  # the first builds the shape's kernels
        table.observe(1, 1, ms)
    assert table.ms(1, 1) is None
    table.observe(1, 1, 145.0)
    assert table.ms(1, 1) == 145.0  # the lower median of 140, 145, 150; the 900 is not among them


def test_the_rows_a_forward_costs_least_per_row_at():
    # The 0.5B draft's probe on an AVX2 CPU without native bf16 (int8 products to 16 rows,
    # bf16 beyond): 16 rows cost 41.7 ms, 32 rows 764.7.
    avx2 = ForwardCost(probe_rows=(1, 4, 8, 16, 32, 64), probe_ms=(19.3, 20.1, 26.3, 41.7, 764.7, 1520.0))
    assert avx2.cheapest_rows() == 16
    # Rows ever cheaper (a GPU, a CPU with native bf16): no count to split work at.
    assert ForwardCost(probe_rows=(1, 16, 64), probe_ms=(10.0, 11.0, 14.0)).cheapest_rows() is None
    assert ForwardCost(probe_rows=(4,), probe_ms=(8.0,)).cheapest_rows() is None
    # A large overhead favours wider forwards: 16 rows at (400 + 41.7) / 16 still beat 64 at
    # (400 + 1520) / 64, but not where the overhead dwarfs both.
    avx2.overhead_ms = 400.0
    assert avx2.cheapest_rows() == 16
    avx2.overhead_ms = 40_000.0
    assert avx2.cheapest_rows() is None


def test_a_shapes_median_follows_every_time_it_is_seen():
    # The median is kept between sightings (the policy asks every width each step); each new
    # time, and a shape pushed out of the table, must show in the next answer.
    table = StepCostTable(window=3, min_seen=1, max_keys=2)
    table.observe(1, 1, 100.0)
    assert table.ms(1, 1) == 100.0
    table.observe(1, 1, 50.0)
    table.observe(1, 1, 40.0)
    assert table.ms(1, 1) == 50.0
    table.observe(1, 1, 30.0)  # the window drops 100
    assert table.ms(1, 1) == 40.0
    table.observe(1, 2, 1.0)
    table.observe(1, 3, 1.0)  # pushes (1, 1) out
    assert table.ms(1, 1) is None
    table.observe(1, 1, 7.0)
    assert table.ms(1, 1) == 7.0
