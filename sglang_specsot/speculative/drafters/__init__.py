"""What drafts SPECSOT's verify trees: the SoT context alone, or a draft model merged with it.

Every drafter does the same four things for the worker, which runs every drafter alike:

- `pricing(batch)` / `costs`: what its drafts cost, for the budget policy (`policy/values.py`);
- `draft(batch, decision, policy, settle)`: one tree per request within the decision's budgets,
  calling `settle()` before it reads the SoT context (the last step's committed tokens go in);
- `accept(reqs, committed, proposal)`: the committed tokens into the SoT context, and what
  verify accepted of its drafts (`Verified`, the policy's evidence);
- `draft_extend(batch, result, proposal, policy)`: whatever its next draft needs (a draft
  model's forward over the committed tokens, or deferring it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.host_sync import Committed
from sglang_specsot.speculative.policy.step_policy import StepPolicy
from sglang_specsot.speculative.policy.values import (
    DraftCosts,
    StepDecision,
    StepPricing,
    Verified,
)


@dataclass(frozen=True)
class Proposal:
    """One step's drafts: a tree per request (root = its bonus token), unpadded."""

    trees: tuple[DraftTree, ...]
    source: str  # what computed the first draft: context, extend or catch_up
    decision: StepDecision  # the plan the trees were drafted for (a drafter may replan mid-draft)

    def priced_width(self, verify_width: int) -> int:
        """The verify width the plan priced, under which the step's time is kept."""
        return verify_width


class Drafter(Protocol):
    costs: DraftCosts
    # Whether a step's committed tokens may wait for the next draft's `settle()`: its
    # draft-extend reads nothing of them on the host.
    settles_late: bool

    def pricing(self, batch) -> StepPricing: ...

    def draft(self, batch, decision: StepDecision, policy: StepPolicy, settle: Callable[[], None]) -> Proposal: ...

    def accept(self, reqs, committed: Committed, proposal: Proposal) -> Verified: ...

    def draft_extend(self, batch, result, proposal: Proposal, policy: StepPolicy) -> bool: ...  # a deferrable extend ran

    @property
    def catch_ups(self) -> int: ...  # deferred extends caught up so far

    def after_prefill(self, batch, result): ...  # the next draft input after a prefill

    def policies(self) -> dict[str, StepPolicy]: ...  # its own planners, by StepDecision.planner

    def forget(self, rid: str) -> None: ...

    def clear(self) -> None: ...

    def report(self) -> dict: ...
