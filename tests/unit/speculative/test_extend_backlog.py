"""Deferred draft-extend: the backlog's bookkeeping and the catch-up passes' arithmetic."""

from __future__ import annotations

import random

import pytest

from sglang_specsot.speculative.extend_backlog import ExtendBacklog, catch_up_passes, deduplicated, passes_ms


def test_one_pass_when_the_backlog_fits():
    passes = catch_up_passes(ends=[40, 50, 30], behind=[5, 0, 2], max_rows=512)
    # One prefill-shaped forward: each request over its backlog, a current one over its
    # last position (its top-k is needed too), all ending at their ends.
    assert passes == [[(35, 40), (49, 50), (28, 30)]]


def test_nothing_to_do_without_a_backlog():
    assert catch_up_passes(ends=[10, 20], behind=[0, 0], max_rows=512) == []


def test_a_whole_prompt_behind_is_one_ragged_pass_not_a_square_window():
    # A deferred prefill of 300 tokens beside a request one step behind: 301 rows, where a
    # decode-shaped window (the same width for every request) would take 600.
    passes = catch_up_passes(ends=[300, 90], behind=[300, 1], max_rows=4096)
    assert passes == [[(0, 300), (89, 90)]]


def test_a_backlog_over_max_rows_takes_several_passes_oldest_first():
    passes = catch_up_passes(ends=[100, 40], behind=[100, 3], max_rows=64)  # 32 rows a request a pass
    assert passes == [
        [(0, 32), (37, 40)],
        [(32, 64), (39, 40)],
        [(64, 96), (39, 40)],
        [(96, 100), (39, 40)],
    ]


@pytest.mark.parametrize("seed", range(50))
def test_passes_cover_every_backlog_position_and_end_at_the_ends(seed):
    rng = random.Random(seed)
    ends = [rng.randint(1, 60) for _ in range(rng.randint(1, 8))]
    behind = [rng.randint(0, e) for e in ends]
    max_rows = rng.choice([1, 7, 16, 64, 4096])
    passes = catch_up_passes(ends, behind, max_rows)
    if not any(behind):
        assert passes == []
        return
    assert [e for _, e in passes[-1]] == ends  # the last pass's top-k is at every request's end
    quota = max(1, max_rows // len(ends))
    for ranges in passes:
        assert all(0 <= s < e <= end for (s, e), end in zip(ranges, ends))
        assert all(e - s <= quota for s, e in ranges)
    for i in range(len(ends)):
        written = [p for ranges in passes for p in range(*ranges[i])]
        backlog = list(range(ends[i] - behind[i], ends[i]))
        # The backlog, all of it, oldest first; after it only rewrites of the last position.
        assert written[: len(backlog)] == backlog
        assert all(p == ends[i] - 1 for p in written[len(backlog) :])


def test_backlog_adds_clears_and_drops_requests_that_left():
    backlog = ExtendBacklog()
    assert backlog.current(["a", "b"])
    backlog.add(["a", "b"], [1, 3])
    backlog.add(["a", "b"], [2, 1])
    assert backlog.lag(["a", "b", "c"]) == [3, 4, 0] and not backlog.current(["a"])
    backlog.keep(["b"])  # "a" finished
    assert backlog.lag(["a", "b"]) == [0, 4]
    backlog.clear(["b"])
    assert backlog.current(["a", "b"]) and backlog.info()["requests_behind"] == 0


def test_a_deferred_prefill_starts_a_backlog():
    backlog = ExtendBacklog()
    backlog.start("a", 120)  # its prompt, none of it in the draft's KV
    backlog.start("b", 0)  # all of it in a cached prefix the draft had extended
    assert backlog.lag(["a", "b"]) == [120, 0]
    assert backlog.catch_up_rows(["a", "b"]) == 121  # b re-extends its last position
    assert backlog.catch_up_rows(["b"]) == 0
    assert backlog.info()["deferred_prefills"] == 2


def _defer_while_allowed(backlog, rids, draft_ms, limit_ms) -> int:
    """Plain steps as the worker runs them: add the step's token, then defer or catch up."""
    deferred = 0
    backlog.add(rids, [1] * len(rids))
    while backlog.may_defer(rids, draft_ms, limit_ms):
        deferred += 1
        backlog.add(rids, [1] * len(rids))
    return deferred


def test_defers_only_while_the_catch_up_stays_within_the_limit():
    backlog = ExtendBacklog()
    draft_ms = lambda rows: 4.0 if rows <= 32 else 4.0 + 0.5 * (rows - 32)  # noqa: E731
    limit_ms = 10.0  # the worker's: a one-token extend plus the target's forward of the batch
    rids = [f"r{i}" for i in range(4)]
    deferred = _defer_while_allowed(backlog, rids, draft_ms, limit_ms)
    # 4 rows per backlog token, free to 32 rows, then 0.5 ms a row: a catch-up of <= 44 rows
    # costs <= 10 ms, so 10 steps wait and the 11th catches up on 11 tokens each.
    assert deferred == 10 and backlog.lag(rids) == [11] * 4
    assert draft_ms(4 * 11) <= limit_ms < draft_ms(4 * 12)


def test_without_a_limit_the_backlog_waits_however_long_it_grows():
    # A backlog costs no memory (the tokens are in the drafter's history), and catching up
    # is priced where drafting would start again: nothing forces a flush.
    backlog = ExtendBacklog()
    backlog.add(["a", "b"], [5000, 1])
    assert backlog.may_defer(["a", "b"], lambda rows: rows * 1.0, float("inf"))


def test_nothing_is_deferred_when_a_catch_up_would_cost_more_than_the_limit():
    backlog = ExtendBacklog()
    assert _defer_while_allowed(backlog, ["a", "b"], lambda rows: 20.0, 10.0) == 0


def test_a_shared_prefix_is_left_to_one_request_when_the_catch_up_is_one_pass():
    # 5 SoT branches of a 161-token prompt, 145 of them a prefix they share: 225 rows, not 805.
    ends, behind, shared = [161] * 5, [161] * 5, [0, 145, 145, 145, 145]
    lags = deduplicated(ends, behind, shared, max_rows=4096)
    assert lags == [161, 16, 16, 16, 16]
    assert catch_up_passes(ends, lags, 4096) == [[(0, 161)] + [(145, 161)] * 4]
    backlog = ExtendBacklog()
    for i in range(5):
        backlog.start(f"b{i}", 161)
    rids = [f"b{i}" for i in range(5)]
    assert backlog.catch_up_rows(rids) == 805 and backlog.catch_up_rows(rids, shared=shared) == 225
    assert backlog.catch_up_rows(rids, more=1, shared=shared) == 230


def test_a_shared_prefix_is_extended_by_each_request_when_the_catch_up_takes_passes():
    # Across passes a request would attend to slots another writes only in a later pass:
    # then every request extends its whole backlog, as without sharing.
    ends, behind, shared = [100, 100], [100, 100], [0, 90]
    assert deduplicated(ends, behind, shared, max_rows=64) == [100, 100]  # 32 rows a request a pass
    assert deduplicated(ends, behind, shared, max_rows=256) == [100, 10]


def test_shared_positions_must_lie_within_the_backlog():
    with pytest.raises(AssertionError):
        deduplicated([10, 10], [5, 5], [0, 5], max_rows=64)  # a request keeps its last row


def test_catch_ups_are_priced_at_what_they_have_really_cost_within_bounds():
    backlog = ExtendBacklog()
    assert backlog.price_ratio() == 1.0  # nothing seen: the cost model's price
    backlog.count_catch_up(rows=10, ms=300.0, priced_ms=100.0)  # one pass moves it a little
    assert backlog.price_ratio() == pytest.approx(1300.0 / 1100.0)
    backlog.count_catch_up(rows=400, ms=4800.0, priced_ms=3900.0)
    assert backlog.price_ratio() == pytest.approx(6100.0 / 5000.0)
    assert backlog.info()["catch_up_price_ratio"] == 1.22
    backlog.count_catch_up(rows=400, ms=100000.0, priced_ms=1000.0)
    assert backlog.price_ratio() == 3.0  # bounded: one machine stall does not stop drafting
    cheap = ExtendBacklog()
    cheap.count_catch_up(rows=400, ms=10.0, priced_ms=100000.0)
    assert cheap.price_ratio() == 0.5


def test_a_catch_up_in_passes_costs_each_pass():
    def ms(rows: int) -> float:
        return 10.0 + rows

    assert passes_ms(48, 16, ms) == 3 * 26.0
    assert passes_ms(50, 16, ms) == 3 * 26.0 + 12.0  # the last pass takes the 2 rows left
    assert passes_ms(10, 16, ms) == 20.0 and passes_ms(0, 16, ms) == 0.0
    with pytest.raises(AssertionError, match="pass_rows 0"):
        passes_ms(10, 0, ms)
