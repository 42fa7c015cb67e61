"""Verify tiers: the widths a step pads to where graphs replay, and how the policy prices them."""

from __future__ import annotations

import pytest

from sglang_specsot.speculative.policy.tiers import TIERS_ENV, TierCounts, VerifyTiers


@pytest.mark.parametrize(
    ("window", "widths"),
    [(1, (1,)), (2, (1, 2)), (6, (1, 2, 4, 6)), (8, (1, 2, 4, 8)), (11, (1, 2, 4, 8, 11))],
)
def test_tier_powers_end_at_the_window(window, widths):
    assert VerifyTiers.powers(window).widths == widths


def test_tier_padding_takes_the_smallest_tier_that_holds_the_width():
    tiers = VerifyTiers.powers(8)
    assert [tiers.padded(w) for w in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert VerifyTiers.every(8).padded(5) == 5  # eager: nothing padded
    with pytest.raises(ValueError, match="outside 1..8"):
        tiers.padded(9)


def test_tier_env_is_parsed_and_refused_with_the_fix(monkeypatch):
    assert VerifyTiers.for_graphs(8, draft_model=False).widths == (1, 2, 4, 8)
    assert VerifyTiers.for_graphs(8, draft_model=True).widths == (1, 8)  # the draft-extend graph's width
    assert VerifyTiers.every(8).widths == tuple(range(1, 9))
    monkeypatch.setenv(TIERS_ENV, "1,3,8")
    assert VerifyTiers.for_graphs(8, draft_model=False).widths == (1, 3, 8)
    assert VerifyTiers.for_graphs(8, draft_model=True).widths == (1, 3, 8)
    for bad, message in (("1,4", "must be the verify window, 8"), ("2,8", "starting at 1"),
                         ("1,x,8", "comma-separated"), ("1,4,4,8", "distinct")):  # fmt: skip
        monkeypatch.setenv(TIERS_ENV, bad)
        with pytest.raises(ValueError, match=message):
            VerifyTiers.for_graphs(8, draft_model=False)


def test_tier_counts_report_replays_and_eager_steps_by_width():
    counts = TierCounts()
    for width, replayed in ((1, True), (4, True), (4, True), (8, False)):
        counts.count(width, replayed)
    assert counts.info() == {"replayed_by_width": {"1": 1, "4": 2}, "eager_by_width": {"8": 1}}


def test_tier_pricing_charges_a_padded_width_its_tier():
    from sglang_specsot.speculative.policy.config import AdaptiveConfig
    from sglang_specsot.speculative.policy.step_policy import StepPolicy

    class RowCosts:  # a step costs its verify rows
        bounded_by_wider, learns_from_shadows, min_budget = False, False, 0

        def candidate_budgets(self, budgets):
            return budgets

        def modelled_ms(self, bs, width):
            return 10.0 * bs * width

    policy = StepPolicy(AdaptiveConfig.default(7), 8, RowCosts())
    assert policy.step_ms(1, 5) == 50.0
    policy.tiers = VerifyTiers.powers(8)
    assert [policy.step_ms(1, w) for w in (1, 2, 3, 5)] == [10.0, 20.0, 40.0, 80.0]
