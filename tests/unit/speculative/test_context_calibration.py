"""The SoT context's first-draft estimates, read through what they realised on drafting steps
(drafters/context.py `CalibratedFirsts`)."""

from __future__ import annotations

import dataclasses

from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.drafters import Proposal
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.planning import StepPlan
from sglang_specsot.speculative.policy.values import StepDecision
from tests.unit.speculative.builders import WINDOW, batch, context_worker, cost


def _proposal(worker, first: float, drafted: bool) -> Proposal:
    step = batch(1)
    view = worker.requests.view(step.reqs)
    decision = StepDecision(view, StepPlan(2, (1,), 1 + first, 200.0), (0.6,), (first,), exploring=False, adaptive=True)
    tree = DraftTree((1, 2), (-1, 0)) if drafted else DraftTree((1,), (-1,))
    return Proposal((tree,), "context", decision)


def test_drafting_steps_teach_what_an_estimate_realises():
    worker = context_worker(AdaptiveConfig.default(WINDOW - 1))
    context = worker.drafter
    assert context.pricing(None).first_acceptance([0.6]) == [0.6]  # no evidence yet: the estimate
    missed = _proposal(worker, 0.6, drafted=True)
    for _ in range(20):  # estimated at 0.6, the first draft was never taken
        context.calibrate(missed, [1])
    assert context.pricing(None).first_acceptance([0.6])[0] < 0.15
    assert context.pricing(None).first_acceptance([0.97]) == [0.97]  # another estimate keeps its own
    # Plain steps drafted nothing: they teach nothing; nor does a fixed window, which has no estimate.
    before = context.calibration.info()
    context.calibrate(_proposal(worker, 0.97, drafted=False), [1])
    fixed = _proposal(worker, 0.97, drafted=True)
    context.calibrate(dataclasses.replace(fixed, decision=dataclasses.replace(fixed.decision, firsts=())), [1])
    assert context.calibration.info() == before


def test_the_policy_stops_drafting_where_its_estimates_did_not_realise():
    """A second row costs 30 ms after a 100 ms plain step: at the running first-draft estimate, one
    draft pays on paper; after drafting steps at that estimate that never took a draft, not."""
    config = AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0)
    worker = context_worker(config, cost((1, 2), (100.0, 130.0)))
    worker.policy.stats.observe("r0", 1, 1, None)  # some evidence, so the plan is not cold
    step = batch(1)
    view = worker.requests.view(step.reqs)
    firsts = worker.policy.first_acceptance(view)
    assert worker.policy.plans(worker.policy.acceptance(view), firsts)[-1].rate > worker.policy.plain_plan(1).rate
    missed = _proposal(worker, firsts[0], drafted=True)
    for _ in range(30):
        worker.drafter.calibrate(missed, [1])
    calibrated = worker.drafter.pricing(step).first_acceptance(firsts)
    assert worker.policy.plans(worker.policy.acceptance(view), calibrated)[-1].rate < worker.policy.plain_plan(1).rate
