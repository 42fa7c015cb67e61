"""Plan the branches of a skeleton: how many, their token budgets, and the order they start in."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from sglang_specsot.sot.config import DEFAULT_CONFIG, SoTConfig
from sglang_specsot.sot.skeleton import PLAN, SkeletonParse

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Branch:
    """One point to expand: its skeleton position, text and decode budget."""

    index: int  # 0-based position in the skeleton; the merge order
    point: str
    max_new_tokens: int
    predicted_tokens: int | None  # from the skeleton's "(n)" when it gave one


@dataclass(frozen=True, slots=True)
class BranchPlan:
    """The planning phase's result: branches in start order (longest first)."""

    branches: tuple[Branch, ...]  # start order: largest budget first, ties by skeleton order
    max_running: int
    dropped_points: tuple[str, ...] = ()  # points past the branch cap, never expanded
    # The length each point aims at (sot.budget.POINT_AIM_TOKENS): past it a branch ends at its
    # next sentence end (gen_requests._end_after); None: budgets come from predictions or
    # default_branch_tokens and no branch ends early.
    point_tokens: int | None = None

    @property
    def points(self) -> tuple[str, ...]:
        """The planned points in skeleton order, as `merge_answer` expects them."""
        return tuple(b.point for b in sorted(self.branches, key=lambda b: b.index))

    @property
    def total_budget(self) -> int:
        return sum(b.max_new_tokens for b in self.branches)

    def scheduler(self) -> BranchScheduler:
        return BranchScheduler(self)


def plan_branches(parse: SkeletonParse, config: SoTConfig = DEFAULT_CONFIG, point_tokens: int | None = None) -> BranchPlan:
    """Cap the points, budget each from its predicted length (else from `point_tokens`, the
    length each point is aimed at), and order longest first."""
    if parse.outcome != PLAN:
        raise ValueError(
            f"plan_branches needs a parse with outcome 'plan', got {parse.outcome!r} "
            f"({parse.reason}); answer the question normally instead"
        )
    kept, dropped = parse.points[: config.branch_cap], parse.points[config.branch_cap :]
    branches = [
        Branch(i, p.text, branch_budget(point_aim(p.predicted_tokens, point_tokens), config), p.predicted_tokens)
        for i, p in enumerate(kept)
    ]
    # Longest-processing-time first: the longest branch bounds the answer's latency, so it
    # must not be the one left waiting for a free slot.
    branches.sort(key=lambda b: (-b.max_new_tokens, b.index))
    plan = BranchPlan(tuple(branches), config.max_running, tuple(p.text for p in dropped), point_tokens)
    logger.debug("planned %d branches, %d dropped", len(branches), len(dropped))
    return plan


def point_aim(predicted: int | None, point_tokens: int | None) -> int | None:
    """The tokens a point is aimed at: the skeleton's prediction for it, else the answer's
    point target; None with neither."""
    return predicted if predicted is not None else point_tokens


def branch_budget(aim: int | None, config: SoTConfig) -> int:
    """A branch's max_new_tokens for a point aimed at `aim` tokens (the skeleton's prediction
    or the answer's point target): headroom over the aim (`predicted_length_slack`), so the
    branch ends its last sentence before the budget does; `default_branch_tokens` without one."""
    if aim is None:
        return config.default_branch_tokens
    wanted = round(aim * config.predicted_length_slack)
    return max(config.min_branch_tokens, min(config.max_branch_tokens, wanted))


@dataclass(frozen=True, slots=True)
class BranchScheduler:
    """Pure continuous batching: given what runs and what finished, say what starts next."""

    plan: BranchPlan

    def next_to_start(
        self, running: Collection[int], finished: Collection[int]
    ) -> tuple[Branch, ...]:
        """Waiting branches (by skeleton index) to start now, in plan order, filling free slots."""
        self._check(running, finished)
        free = self.plan.max_running - len(set(running))
        if free <= 0:
            return ()
        busy = set(running) | set(finished)
        waiting = [b for b in self.plan.branches if b.index not in busy]
        return tuple(waiting[:free])

    def is_done(self, finished: Collection[int]) -> bool:
        """True once every planned branch has finished."""
        return {b.index for b in self.plan.branches} <= set(finished)

    def _check(self, running: Collection[int], finished: Collection[int]) -> None:
        known = {b.index for b in self.plan.branches}
        unknown = (set(running) | set(finished)) - known
        if unknown:
            raise ValueError(
                f"branch indices {sorted(unknown)} are not in this plan (indices "
                f"{sorted(known)}); pass the `index` of branches this scheduler returned"
            )
        both = set(running) & set(finished)
        if both:
            raise ValueError(
                f"branches {sorted(both)} are both running and finished; remove a branch "
                "from `running` when it finishes"
            )
