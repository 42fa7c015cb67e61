"""Keep vs spread priced from a rank's row-cost curve (sot/placement_cost.py)."""

from __future__ import annotations

import pytest

from sglang_specsot.sot.latency import AnswerShape, RowCosts
from sglang_specsot.sot.placement_cost import placement_cost

# The load test's SmolLM2 SPECSOT curve on one EPYC core (cheap rows: 8 cost 1.3x one) and the
# 1.5B's probe on an AVX2-only EPYC (linear rows); four points of 40 tokens, all at once.
CHEAP = RowCosts((1, 4, 8, 16, 32, 64), (23.956, 25.818, 28.026, 33.136, 43.765, 73.303), 75.518)
LINEAR = RowCosts((1, 4, 8), (197.0, 677.0, 1355.0))
SHAPE = AnswerShape(normal_tokens=160, skeleton_tokens=40, branch_tokens=(40, 40, 40, 40), max_running=4,
                    branch_prompt_tokens=150)  # fmt: skip


def test_alone_on_cheap_rows_spreading_saves_almost_nothing():
    cost = placement_cost(CHEAP, SHAPE, ranks=2)
    assert 1.0 < cost.ratio < 1.05


def test_alone_on_linear_rows_spreading_halves_the_rows_of_each_decode_step():
    cost = placement_cost(LINEAR, SHAPE, ranks=2)
    prefill = LINEAR.step_ms(150)  # the same either way alone: each rank commits in parallel
    assert cost.keep_ms == pytest.approx(prefill + 40 * LINEAR.step_ms(4))
    assert cost.spread_ms == pytest.approx(prefill + 40 * LINEAR.step_ms(2))
    assert cost.ratio > 1.2


@pytest.mark.parametrize("costs", [CHEAP, LINEAR])
def test_with_others_running_keeping_is_never_slower(costs):
    for shared in (1, 3, 8, 31):
        assert placement_cost(costs, SHAPE, ranks=2, shared=shared).ratio <= 1.0


def test_one_rank_or_one_point_prices_both_alike():
    assert placement_cost(LINEAR, SHAPE, ranks=1).ratio == pytest.approx(1.0)
    one = AnswerShape(160, 40, (40,), 4, branch_prompt_tokens=150)
    assert placement_cost(LINEAR, one, ranks=4).ratio == pytest.approx(1.0)


def test_nonsense_is_refused():
    with pytest.raises(ValueError, match="ranks=0"):
        placement_cost(CHEAP, SHAPE, ranks=0)
