"""The values the budget policy and the worker hand each other at a step's stage boundaries.

A decode step is planned from a `StepView` (the batch as the policy sees it), decided into a
`StepDecision`, learned from through `Verified` (what verify accepted) and accounted for
through a `StepOutcome` (what the step cost and committed). All frozen: no stage reads
another's fields after the fact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sglang_specsot.speculative.policy.planning import StepPlan


def runs_key(size: int, roles: str) -> str:
    """DraftingRuns' key for a batch of `size` requests with these SoT roles ("5 branch")."""
    return f"{size} {roles}"


@dataclass(frozen=True)
class StepView:
    """A decode batch as the policy sees it: one entry per request, in batch order."""

    keys: tuple[str, ...]  # acceptance key: the request's SoT group (branches write alike), else its rid
    roles: tuple[str, ...]  # SoT role: plain, skeleton or branch
    left: tuple[int | None, ...]  # tokens the request may still write (None: no max_new_tokens)

    @property
    def bs(self) -> int:
        return len(self.keys)

    @property
    def role_set(self) -> str:
        """The batch's roles as DraftingRuns keys them: "branch", "plain+skeleton"."""
        return "+".join(sorted(set(self.roles)))

    @property
    def runs_key(self) -> str:
        return runs_key(self.bs, self.role_set)

    def steps_left(self, tokens_per_step: float) -> float:
        """Steps a request has left on average at `tokens_per_step` each (inf where one has
        no cap: its end is unknown)."""
        if any(n is None for n in self.left):
            return math.inf
        return sum(self.left) / len(self.left) / max(tokens_per_step, 1.0)


class DraftCosts(Protocol):
    """What a drafter's drafts cost, as the policy prices plans (fixed for a server's life)."""

    min_budget: int  # drafts every request gets whatever the plan (a fixed chain or tree)
    learns_from_shadows: bool  # plain steps teach the estimates for free (SoT-context drafts)
    bounded_by_wider: bool  # a narrower step never costs more than a wider one measured

    def candidate_budgets(self, budgets: tuple[int, ...]) -> tuple[int, ...]: ...

    def modelled_ms(self, bs: int, width: int) -> float: ...


class StepPricing(Protocol):
    """What drafting this batch needs beyond its plan, as the drafter knows it this step."""

    def setup_ms(self) -> float: ...  # work before the next drafting step (a deferred extend's catch-up)

    def first_acceptance(self, firsts: Sequence[float]) -> list[float]: ...  # by the drafter's own confidence


@dataclass(frozen=True)
class StepDecision:
    """The plan of one step and what it was decided from."""

    view: StepView
    plan: StepPlan
    ps: tuple[float, ...]  # each request's chance a draft is accepted given its parent was
    firsts: tuple[float, ...]  # each request's running acceptance of its first draft
    exploring: bool  # drafts to learn, not because it pays
    adaptive: bool  # False: the whole window every step (SGLANG_SPECSOT_FIXED_WINDOW=1)
    candidates: dict[str, list[float]] | None = None  # width -> [expected tokens, ms], for the step log
    # The policy that decided it, which learns from the step: the worker's ("main"), or one a
    # drafter keeps for an alternative of its own ("context": a draft model's SoT context alone).
    planner: str = "main"

    @property
    def sizes(self) -> list[int]:
        """Tree nodes (root included) each request may draft."""
        return [b + 1 for b in self.plan.budgets]


@dataclass(frozen=True)
class Verified:
    """What verify accepted of each request's drafts: the acceptance estimates' evidence."""

    depths: tuple[int, ...]  # drafts a chain through the request's tree could have accepted
    accepted: tuple[int, ...]  # of those, how many were right (<= depth)
    source: str  # what computed the first draft: context, extend or catch_up
    shadows: tuple[tuple[int, int, int], ...] = ()  # (request, depth, accepted) of walked shadow drafts
    committed: int = 0  # tokens verify committed over the batch, bonus tokens included


@dataclass(frozen=True)
class StepOutcome:
    """What one decode step cost and committed, for the policy's ledgers."""

    decision: StepDecision
    ms: float  # draft + verify + draft-extend, wall clock
    committed: int  # tokens the step committed, over the batch
    priced_width: int  # the verify width its plan priced (runner-ups excluded)
    drafted: bool  # the verify held drafts (width > 1)
    extended_on_plain_step: bool  # a plain step that ran the draft-extend (a backlog flush)
    timed: bool  # the host waited for the forwards (CPU): the wall clock is the step's cost
    caught_up: bool  # a deferred extend's catch-up ran in it: owed work, whatever the step is

    @property
    def view(self) -> StepView:
        return self.decision.view
