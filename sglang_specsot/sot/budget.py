"""Split an answer's completion-token cap between the skeleton and the branches.

A client's `max_tokens` caps the whole answer (what OpenAI clients expect), not each
generation. The skeleton gets its configured budget, less what `min_points` branches of
`min_branch_tokens` need; the branches share what the skeleton left. When that cannot hold
`min_points` branches, the answer is given normally within what is left.
"""

from __future__ import annotations

from dataclasses import replace

from sglang_specsot.sot.config import SoTConfig
from sglang_specsot.sot.planner import BranchPlan

# The shortest skeleton that can hold two short points ("1. Cost\n2. Speed"); a cap that
# leaves less is no SoT answer.
MIN_SKELETON_TOKENS = 16


def min_sot_tokens(config: SoTConfig) -> int:
    """The smallest cap an SoT answer fits in: a minimal skeleton and `min_points` branches."""
    return MIN_SKELETON_TOKENS + config.min_points * config.min_branch_tokens


def skeleton_budget(config: SoTConfig, cap: int | None) -> int:
    """The skeleton's max_new_tokens: its configured budget, leaving the branches their minimum."""
    if cap is None:
        return config.skeleton_max_tokens
    return max(1, min(config.skeleton_max_tokens, cap - config.min_points * config.min_branch_tokens))


def remaining(cap: int | None, used: int) -> int | None:
    """What the cap leaves after `used` completion tokens (None: no cap)."""
    return None if cap is None else max(0, cap - used)


def fit_plan(plan: BranchPlan, budget: int | None, config: SoTConfig) -> BranchPlan | None:
    """`plan` with branch budgets summing to at most `budget`, or None when not even
    `min_points` branches of `min_branch_tokens` fit.

    Later points are dropped first (the skeleton's order is its priority), then the largest
    budgets are lowered to a common level, so short points keep what they asked for.
    """
    if budget is None or plan.total_budget <= budget:
        return plan
    in_order = sorted(plan.branches, key=lambda b: b.index)
    fitting = min(len(in_order), budget // config.min_branch_tokens)
    if fitting < config.min_points:
        return None
    kept, cut = in_order[:fitting], in_order[fitting:]
    level = _level([b.max_new_tokens for b in kept], budget)
    branches = [replace(b, max_new_tokens=min(b.max_new_tokens, level)) for b in kept]
    branches.sort(key=lambda b: (-b.max_new_tokens, b.index))
    dropped = tuple(b.point for b in cut) + plan.dropped_points
    return BranchPlan(tuple(branches), plan.max_running, dropped)


def _level(budgets: list[int], total: int) -> int:
    """The largest level L with sum(min(b, L)) <= total (water-filling from the top)."""
    left, ordered = total, sorted(budgets)
    for i, b in enumerate(ordered):
        share = left // (len(ordered) - i)
        if b > share:
            return share
        left -= b
    return ordered[-1] if ordered else 0
