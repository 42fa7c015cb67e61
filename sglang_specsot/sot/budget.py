"""How long a SoT answer's parts may be: the length it aims at, and the cap it must fit in.

The aim: each point as long as a point of a complete answer needs (`POINT_AIM_TOKENS`, about
three sentences), not a share of a total. A share made every point of a broad question thin
(one or two sentences each when the skeleton had many points); with a fixed aim per point the
answer's length follows its skeleton, whose point count follows the question. Each branch ends
at its first sentence end past the aim (sot.finish) and gets `predicted_length_slack` times it
as its budget, the bound for a point that never ends a sentence. `point_target` (the aim a
normal answer's length shared by the points) is what the latency model prices SoT at: equal
length, so SoT is never chosen for writing less.

The cap: a client's `max_tokens` caps the whole answer (what OpenAI clients expect), not each
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
# Until a server has seen normal answers of its own, the 1.5B's greedy normal answers to the
# suitable questions of router_train at a 384-token cap (the tuning set;
# docs/benchmarks.md#answer-length), never the held-out questions the reports score on:
# their median, what a normal answer is expected to cost (sot.latency prices it).
EXPECTED_ANSWER_TOKENS = 319
# What each point aims at: the 1.5B's sentences are about 19 tokens (tuning answers), so a
# branch ending at its first sentence end past 48 tokens writes about three sentences, the
# middle of the "two to four" its prompt asks for (prompts.POINT_LENGTH).
POINT_AIM_TOKENS = 48
# A point of one sentence is about this long: a shorter target would leave points empty.
MIN_POINT_TOKENS = 24
# A branch past its aim ends at its next sentence end (sot.finish): about half a sentence later,
# plus the tokens decoded before the abort takes hold. Measured on the 1.5B's tuning answers
# (docs/benchmarks.md#answer-length): 12 tokens past the aim on average. The aim leaves room.
HALF_SENTENCE_TOKENS = 12


def expected_tokens(expected: int | None, cap: int | None) -> int:
    """The normal answer's expected length within the cap (`expected` None: the prior)."""
    return _within_cap(EXPECTED_ANSWER_TOKENS if expected is None else expected, cap)


def _within_cap(tokens: int, cap: int | None) -> int:
    return tokens if cap is None else min(cap, tokens)


def point_target(expected: int, skeleton_tokens: int, points: int) -> int:
    """The tokens after which each of `points` points may end (at its next sentence) for the
    SoT answer to be about `expected` tokens long (its aim): what the skeleton leaves, shared
    evenly, less the half sentence a point runs on past its aim; at least MIN_POINT_TOKENS.

    Shared evenly because nothing known before the branches run says one point needs more than
    another; the skeleton counts because its titles are part of the answer a reader gets."""
    if points < 1:
        raise ValueError(f"points={points} must be at least 1: a plan has points to share the length")
    return max(MIN_POINT_TOKENS, (expected - skeleton_tokens) // points - HALF_SENTENCE_TOKENS)


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
    return replace(plan, branches=tuple(branches), dropped_points=dropped)


def _level(budgets: list[int], total: int) -> int:
    """The largest level L with sum(min(b, L)) <= total (water-filling from the top)."""
    left, ordered = total, sorted(budgets)
    for i, b in enumerate(ordered):
        share = left // (len(ordered) - i)
        if b > share:
            return share
        left -= b
    return ordered[-1] if ordered else 0
