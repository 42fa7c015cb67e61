"""Step plans: per request draft budgets that maximise expected committed tokens per ms.

Each plan weighs what drafts are expected to bring (acceptance.py) against what the verify
window costs on this machine (a step-cost function, measured). Plain decoding (width 1) is a
plan like any other: where no budget beats it in tokens per ms, the step decodes plain.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sglang_specsot.speculative.policy.acceptance import (
    expected_drafts_accepted,
    useful_budget,
)


@dataclass(frozen=True)
class StepPlan:
    """What one step drafts and verifies."""

    width: int  # verify window per request incl. the bonus row (1 = plain decode)
    budgets: tuple[int, ...]  # draft tokens per request (0 = none), each <= width - 1
    expected_tokens: float  # committed tokens the model expects from the step
    step_ms: float  # what the cost model expects the step to take

    @property
    def rate(self) -> float:
        return self.expected_tokens / self.step_ms if self.step_ms > 0 else 0.0


# A drafting plan within this share of the best plan's rate is "near paying": acceptance
# estimates move by about a tenth per verified step (decay 0.1), so it may pay a few steps on.
NEAR_PAYING = 0.9


def drafting_near(plans: Sequence[StepPlan], best: StepPlan) -> bool:
    """Whether some plan that drafts comes within NEAR_PAYING of `best`'s rate."""
    rates = [plan.rate for plan in plans if plan.width > 1]
    return bool(rates) and max(rates) >= NEAR_PAYING * best.rate


def best_plan(plans: Sequence[StepPlan]) -> StepPlan:
    """The plan with the most expected tokens per ms; ties go to the narrower (listed first)."""
    best: StepPlan | None = None
    for plan in plans:
        if best is None or plan.rate > best.rate * (1.0 + 1e-9):
            best = plan
    assert best is not None, "no candidate budgets"
    return best


def candidate_plans(
    ps: Sequence[float],
    candidates: Sequence[int],
    step_ms: Callable[[int, int], float],
    min_token_prob: float,
    min_budget: int = 0,
    firsts: Sequence[float] | None = None,
) -> list[StepPlan]:
    """One plan per distinct candidate budget, narrowest first (see `plan_step`)."""
    bs = len(ps)
    firsts = list(ps) if firsts is None else list(firsts)
    assert len(firsts) == bs, f"{len(firsts)} first-draft estimates for {bs} requests"
    plans = []
    for budget in sorted({max(min_budget, b) for b in candidates}):
        budgets = tuple(
            max(min_budget, useful_budget(p, budget, min_token_prob, f)) for p, f in zip(ps, firsts)
        )
        tokens = bs + sum(expected_drafts_accepted(p, b, f) for p, b, f in zip(ps, budgets, firsts))
        width = 1 + max(budgets, default=0)
        plans.append(StepPlan(width, budgets, tokens, step_ms(bs, width)))
    return plans


def explore_every(plain_ms: float, explore_ms: float, share: float) -> int:
    """Plain steps per exploring step so that exploring costs at most `share` of their time
    (0 = never explore). An exploring step costs `explore_ms` where a plain one costs `plain_ms`."""
    if share <= 0.0:
        return 0
    extra = max(0.0, explore_ms - plain_ms)
    return max(1, math.ceil(extra / (share * plain_ms))) if plain_ms > 0 else 1


def may_pay(plans: Sequence[StepPlan], margin: float) -> bool:
    """Whether some plan that drafts beats the plain plan (width 1) by more than `margin`
    (a share of its rate); without a plain plan, whether any plan drafts."""
    plain = [plan.rate for plan in plans if plan.width == 1]
    drafting = [plan.rate for plan in plans if plan.width > 1]
    if not drafting:
        return False
    return not plain or max(drafting) > (1.0 + margin) * plain[0]


def explore_plan(ps: Sequence[float], candidates: Sequence[int], step_ms: Callable[[int, int], float]) -> StepPlan:
    """Every request drafts the smallest positive candidate budget (what learning costs least)."""
    budget = min((b for b in candidates if b > 0), default=0)
    bs = len(ps)
    tokens = bs + sum(expected_drafts_accepted(p, budget) for p in ps)
    return StepPlan(budget + 1, (budget,) * bs, tokens, step_ms(bs, budget + 1))
