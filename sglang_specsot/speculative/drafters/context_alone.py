"""Beside a draft model or head, the SoT context drafting alone, planned by its own policy.

A draft model's plan prices its chain: where the draft is weak (a head trained for other text,
a random one), that plan is a plain step, and the SoT context, which drafts from the prompt,
the skeleton and the sibling branches, would never draft, though on SoT branches it is often
right. So the drafter keeps a second budget policy for the context alone: it learns from
shadow drafts (the tree the context would have proposed, walked by the committed tokens, free)
and from its own steps, prices steps with the context's costs, and the step goes to whichever
plan commits more tokens per ms. Its decisions carry `planner="context"`, so the worker feeds
what those steps accept and cost to this policy, never to the model's.
"""

from __future__ import annotations

from sglang_specsot.speculative.drafters.context import ContextDrafting
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.step_policy import StepPolicy
from sglang_specsot.speculative.policy.values import StepDecision, StepView, Verified

NAME = "context"


class ContextAlone:
    """The SoT context's own plan each step, and what it learns."""

    def __init__(self, context: ContextDrafting, config: AdaptiveConfig, window: int):
        self.context = context
        self.policy = StepPolicy(config, window, context.costs, name=NAME)
        self.steps = 0  # steps it drafted instead of the model

    def decide(self, view: StepView) -> StepDecision:
        return self.policy.decide(view, self.context.calibrated)

    def beats(self, alone: StepDecision, model: StepDecision) -> bool:
        """Whether the context alone commits more tokens per ms than the model's plan; never
        where the model explores (it drafts to learn) or the context's plan is plain."""
        if model.exploring or alone.plan.width == 1:
            return False
        return alone.plan.rate > model.plan.rate

    def trees(self, batch, alone: StepDecision) -> tuple:
        self.steps += 1
        return tuple(self.context.tree(req, n) for req, n in zip(batch.reqs, alone.sizes))

    def propose_shadows(self, batch) -> None:
        """On a step it does not draft, the tree each request would have verified at its widest
        candidate budget, walked later by the committed tokens (`learn_shadows`)."""
        self.context.propose_shadows(batch, 1 + max(self.policy.candidate_budgets(len(batch.reqs))))

    def learn_shadows(self, view: StepView, shadows: list[tuple[int, int, int]]) -> None:
        if shadows:
            self.policy.learn(view, Verified((), (), "shadow", tuple(shadows)))

    def report(self) -> dict:
        plan = self.policy.last_plan
        return {
            "steps": self.steps,
            "last_plan": None if plan is None else {"width": plan.width, "budgets": list(plan.budgets)},
            "acceptance_prior_by_role": self.policy.stats.priors(),
        }
