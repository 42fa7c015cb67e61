"""The length a SoT answer aims at, and splitting its token cap between the skeleton and the branches (sot.budget)."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_specsot.sot import SoTConfig
from sglang_specsot.sot.budget import (
    EXPECTED_ANSWER_TOKENS,
    HALF_SENTENCE_TOKENS,
    MIN_POINT_TOKENS,
    expected_tokens,
    fit_plan,
    min_sot_tokens,
    point_target,
    remaining,
    skeleton_budget,
)
from sglang_specsot.sot.planner import Branch, BranchPlan

CONFIG = SoTConfig()


def plan_of(*budgets: int) -> BranchPlan:
    branches = tuple(Branch(i, f"Point {i}", b, None) for i, b in enumerate(budgets))
    return BranchPlan(tuple(sorted(branches, key=lambda b: (-b.max_new_tokens, b.index))), 4)


def test_the_skeleton_leaves_the_least_branches_need():
    assert min_sot_tokens(CONFIG) == 16 + 2 * 32
    assert skeleton_budget(CONFIG, None) == CONFIG.skeleton_max_tokens
    assert skeleton_budget(CONFIG, 10_000) == CONFIG.skeleton_max_tokens
    assert skeleton_budget(CONFIG, 200) == 200 - 64
    assert skeleton_budget(CONFIG, 80) == 16


def test_remaining_never_goes_negative():
    assert remaining(None, 50) is None
    assert remaining(100, 30) == 70 and remaining(100, 130) == 0


def test_a_plan_within_the_budget_is_unchanged():
    plan = plan_of(128, 64)
    assert fit_plan(plan, None, CONFIG) is plan and fit_plan(plan, 192, CONFIG) is plan


def test_the_largest_budgets_come_down_first():
    fitted = fit_plan(plan_of(40, 300, 120), 300, CONFIG)
    assert {b.index: b.max_new_tokens for b in fitted.branches} == {0: 40, 1: 140, 2: 120}
    assert [b.index for b in fitted.branches] == [1, 2, 0]  # still longest first


def test_later_points_are_dropped_when_each_cannot_get_the_minimum():
    fitted = fit_plan(plan_of(128, 128, 128, 128), 100, CONFIG)
    assert fitted.points == ("Point 0", "Point 1", "Point 2")
    assert fitted.dropped_points == ("Point 3",)
    assert fit_plan(plan_of(128, 128), 63, CONFIG) is None


@given(st.lists(st.integers(32, 384), min_size=2, max_size=16), st.integers(0, 8000))
def test_a_fitted_plan_never_exceeds_its_budget(budgets, budget):
    fitted = fit_plan(plan_of(*budgets), budget, CONFIG)
    if fitted is None:
        assert budget < 2 * CONFIG.min_branch_tokens
        return
    assert fitted.total_budget <= budget
    assert all(b.max_new_tokens >= CONFIG.min_branch_tokens for b in fitted.branches)
    assert len(fitted.branches) + len(fitted.dropped_points) == len(budgets)


def test_the_normal_answers_expected_length_is_the_prior_until_one_is_seen_within_the_cap():
    assert expected_tokens(None, None) == EXPECTED_ANSWER_TOKENS  # the prior, until one is seen
    assert expected_tokens(250, None) == 250 and expected_tokens(250, 120) == 120


TUNING_NORMAL_TOKENS = (384, 113, 384, 319, 368, 204, 189, 305, 370, 266, 380, 327, 215)


def test_the_prior_is_the_tuning_answers_median():
    # benchmarks/e2e-length-tuning-*: the 13 greedy normal answers the prior comes from.
    assert EXPECTED_ANSWER_TOKENS == statistics.median(TUNING_NORMAL_TOKENS)


def _squared_log_ratios(length: float, normals) -> float:
    return sum(math.log(length / n) ** 2 for n in normals)


def test_the_geometric_mean_is_the_fixed_length_nearest_the_normal_answers_in_ratio():
    gm = statistics.geometric_mean(TUNING_NORMAL_TOKENS)
    for other in (statistics.median(TUNING_NORMAL_TOKENS), statistics.mean(TUNING_NORMAL_TOKENS), gm * 0.9, gm * 1.1):
        assert _squared_log_ratios(gm, TUNING_NORMAL_TOKENS) < _squared_log_ratios(other, TUNING_NORMAL_TOKENS)


def test_points_share_what_the_skeleton_leaves_evenly_and_never_below_a_sentence():
    # 52 each, less the half sentence a point runs on past its aim before it ends one.
    assert point_target(300, 40, 5) == 52 - HALF_SENTENCE_TOKENS
    assert point_target(300, 40, 4) == 65 - HALF_SENTENCE_TOKENS  # fewer points: each one longer
    assert point_target(120, 40, 10) == MIN_POINT_TOKENS  # 8 each would leave the points empty
    with pytest.raises(ValueError, match="points=0"):
        point_target(300, 40, 0)


@given(st.integers(40, 2000), st.integers(0, 160), st.integers(2, 10))
def test_the_aimed_points_and_the_skeleton_add_up_to_the_expected_length(expected, skeleton, points):
    ends = point_target(expected, skeleton, points) + HALF_SENTENCE_TOKENS  # where points end, on average
    if ends > MIN_POINT_TOKENS + HALF_SENTENCE_TOKENS:
        assert expected - points < skeleton + points * ends <= expected
