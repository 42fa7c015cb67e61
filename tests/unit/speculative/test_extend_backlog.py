"""Deferred draft-extend: the backlog's bookkeeping and the catch-up windows' arithmetic."""

from __future__ import annotations

import random

import pytest

from sglang_specsot.speculative.extend_backlog import ExtendBacklog, catch_up_windows


def _replay(ends, behind):
    """Which positions of each request the windows write, and the order they come in."""
    written = [set() for _ in ends]
    for w, window_ends in catch_up_windows(ends, behind):
        for i, e in enumerate(window_ends):
            assert 0 <= e - w and e <= ends[i], "a window outside the committed positions"
            written[i].update(range(e - w, e))
    return written


def test_one_window_when_every_request_is_long_enough():
    windows = catch_up_windows(ends=[40, 50, 30], behind=[5, 0, 2])
    assert windows == [(5, [40, 50, 30])]  # one forward, SGLang's layout: all end at their ends


def test_nothing_to_do_without_a_backlog():
    assert catch_up_windows(ends=[10, 20], behind=[0, 0]) == []


def test_a_short_request_splits_the_catch_up_oldest_tokens_first():
    # Request 1 has 3 committed positions; request 0 is 8 behind: windows of 3, then the rest.
    windows = catch_up_windows(ends=[100, 3], behind=[8, 1])
    assert [w for w, _ in windows] == [3, 3, 2]
    assert windows[-1][1] == [100, 3]  # the last window ends at every request's end
    assert windows[0][1] == [95, 3]


@pytest.mark.parametrize("seed", range(50))
def test_windows_cover_every_backlog_position_and_end_at_the_ends(seed):
    rng = random.Random(seed)
    ends = [rng.randint(1, 60) for _ in range(rng.randint(1, 8))]
    behind = [rng.randint(0, e) for e in ends]
    windows = catch_up_windows(ends, behind)
    if not any(behind):
        assert windows == []
        return
    assert windows[-1][1] == ends
    for i, positions in enumerate(_replay(ends, behind)):
        assert set(range(ends[i] - behind[i], ends[i])) <= positions  # the backlog, all of it
        # Positions before the backlog are only ever rewritten (same token, same place).
        assert min(positions) >= 0


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


def test_the_hard_cap_bounds_the_backlog_whatever_the_costs():
    backlog = ExtendBacklog(max_behind=5)
    assert _defer_while_allowed(backlog, ["a"], lambda rows: 0.0, 1.0) == 4
    assert backlog.lag(["a"]) == [5]  # the catch-up covers max_behind tokens, no more


def test_nothing_is_deferred_when_a_catch_up_would_cost_more_than_the_limit():
    backlog = ExtendBacklog()
    assert _defer_while_allowed(backlog, ["a", "b"], lambda rows: 20.0, 10.0) == 0


def test_the_backlog_caps_a_catch_ups_rows():
    backlog = ExtendBacklog(max_behind=256, max_rows=64)
    rids = [f"r{i}" for i in range(8)]
    backlog.add(rids, [7] * 8)
    assert backlog.may_defer(rids, lambda rows: 0.0, float("inf"))  # 8 x 8 rows: at the cap
    backlog.add(rids, [1] * 8)
    assert not backlog.may_defer(rids, lambda rows: 0.0, float("inf"))  # 8 x 9 rows: over it
