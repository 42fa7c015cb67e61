"""Branch planning: caps, budgets, longest-first order, and the pure scheduler."""

from __future__ import annotations

import pytest

from sglang_specsot.sot import (
    DIRECT,
    SkeletonParse,
    SkeletonPoint,
    SoTConfig,
    parse_skeleton,
    plan_branches,
)


def _parse(*points: tuple[str, int | None]) -> SkeletonParse:
    return SkeletonParse("plan", tuple(SkeletonPoint(t, n) for t, n in points), "test", "numbered")


def test_default_budgets_keep_skeleton_order():
    plan = plan_branches(parse_skeleton(" Sleep\n2. Diet\n3. Exercise"))
    assert [b.index for b in plan.branches] == [0, 1, 2]
    assert {b.max_new_tokens for b in plan.branches} == {SoTConfig().default_branch_tokens}
    assert plan.points == ("Sleep", "Diet", "Exercise")


def test_predicted_lengths_give_budgets_and_longest_first_order():
    config = SoTConfig(predicted_length_slack=1.0, min_branch_tokens=32, max_branch_tokens=384)
    plan = plan_branches(_parse(("Intro", 80), ("Core", 300), ("Summary", 120)), config)
    assert [(b.index, b.max_new_tokens) for b in plan.branches] == [(1, 300), (2, 120), (0, 80)]
    assert plan.points == ("Intro", "Core", "Summary")  # merge order stays the skeleton's


def test_budgets_are_clamped_and_get_slack():
    config = SoTConfig(min_branch_tokens=40, max_branch_tokens=200, predicted_length_slack=1.5)
    plan = plan_branches(_parse(("tiny", 1), ("huge", 99999), ("mid", 100), ("none", None)), config)
    budgets = {b.point: b.max_new_tokens for b in plan.branches}
    assert budgets == {"tiny": 40, "huge": 200, "mid": 150, "none": config.default_branch_tokens}
    assert plan.total_budget == 40 + 200 + 150 + config.default_branch_tokens


def test_an_aimed_length_budgets_the_points_without_a_prediction_and_goes_with_the_plan():
    config = SoTConfig(predicted_length_slack=1.5)
    plan = plan_branches(_parse(("a", None), ("b", 100), ("c", None)), config, point_tokens=60)
    assert {b.point: b.max_new_tokens for b in plan.branches} == {"a": 90, "b": 150, "c": 90}
    assert plan.point_tokens == 60  # the branches' prompts ask for it
    assert plan_branches(_parse(("a", None), ("b", None)), config).point_tokens is None


def test_ties_break_by_skeleton_order():
    plan = plan_branches(_parse(("a", 100), ("b", 200), ("c", 100), ("d", 200)))
    assert [b.point for b in plan.branches] == ["b", "d", "a", "c"]


def test_branch_cap_keeps_first_points_and_reports_dropped():
    config = SoTConfig(max_points=10, max_branches=3)
    parse = _parse(*[(f"p{i}", None) for i in range(6)])
    plan = plan_branches(parse, config)
    assert plan.points == ("p0", "p1", "p2")
    assert plan.dropped_points == ("p3", "p4", "p5")


def test_plan_needs_a_plan_outcome():
    parse = parse_skeleton(" just one point")
    assert parse.outcome == DIRECT
    with pytest.raises(ValueError, match="outcome 'plan'.*answer the question normally"):
        plan_branches(parse)


def test_scheduler_fills_free_slots_longest_first_as_branches_finish():
    config = SoTConfig(max_running=2, predicted_length_slack=1.0)
    plan = plan_branches(_parse(("a", 50), ("b", 300), ("c", 200), ("d", 100)), config)
    sched = plan.scheduler()
    first = sched.next_to_start(running=[], finished=[])
    assert [b.point for b in first] == ["b", "c"]
    assert sched.next_to_start(running=[1, 2], finished=[]) == ()
    # "c" finishes: one slot frees, the next longest waiting branch starts.
    assert [b.point for b in sched.next_to_start(running=[1], finished=[2])] == ["d"]
    assert [b.point for b in sched.next_to_start(running=[1, 3], finished=[2])] == []
    assert [b.point for b in sched.next_to_start(running=[], finished=[1, 2, 3])] == ["a"]
    assert not sched.is_done([1, 2, 3])
    assert sched.is_done([0, 1, 2, 3])
    assert sched.next_to_start(running=[], finished=[0, 1, 2, 3]) == ()


def test_scheduler_simulation_runs_every_branch_once_within_the_limit():
    config = SoTConfig(max_running=3, max_points=10, predicted_length_slack=1.0)
    lengths = [40, 250, 90, 300, 60, 120, 200]
    plan = plan_branches(_parse(*[(f"p{i}", n) for i, n in enumerate(lengths)]), config)
    sched = plan.scheduler()
    running: dict[int, int] = {}  # index -> tokens left
    finished: list[int] = []
    started: list[int] = []
    while not sched.is_done(finished):
        for branch in sched.next_to_start(list(running), finished):
            running[branch.index] = branch.max_new_tokens
            started.append(branch.index)
        assert 0 < len(running) <= config.max_running
        index = min(running, key=running.get)  # the branch closest to its end finishes next
        step = running.pop(index)
        running = {i: left - step for i, left in running.items()}
        finished.append(index)
    assert sorted(started) == list(range(len(lengths)))
    assert started[:3] == [3, 1, 6]  # the three longest start first


def test_scheduler_rejects_bad_bookkeeping():
    sched = plan_branches(_parse(("a", None), ("b", None))).scheduler()
    with pytest.raises(ValueError, match=r"\[7\] are not in this plan"):
        sched.next_to_start(running=[7], finished=[])
    with pytest.raises(ValueError, match="both running and finished"):
        sched.next_to_start(running=[0], finished=[0])
