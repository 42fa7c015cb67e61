"""Drafting with a draft model (`ModelDrafting`): its steps' prices, the draft's confidence in
its chains, the SoT context drafting alone, and runner-ups. Its deferred draft-extend:
test_deferred_extend.py."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from sglang_specsot.costs.cost_model import CostModel, ForwardCost
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.drafters import model_chains as chains
from sglang_specsot.speculative.drafters.model import ModelProposal
from sglang_specsot.speculative.host_sync import read_committed
from sglang_specsot.speculative.model_draft import RunnerUps
from sglang_specsot.speculative.policy.acceptance import FirstDraftCalibration
from sglang_specsot.speculative.policy.chains import ChainStop
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.planning import StepPlan
from tests.unit.speculative.builders import (
    WINDOW,
    batch,
    decide,
    decision,
    draft_model,
    model_drafting,
    model_worker,
)

# -- what a step costs ------------------------------------------------------------------------


def test_a_plain_step_with_a_deferred_extend_costs_the_target_alone():
    worker = model_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
    worker.drafter.deferred.backlog.add(["a"], [80])  # the step alone: its catch-up is weighed apart (setup)
    assert worker.policy.step_ms(1, 1) == 100.0  # no extend on a plain step
    assert worker.policy.step_ms(1, 2) == 100.0 + 40.0  # one draft (read from the last extend) and its extend


def test_a_drafting_step_is_priced_with_the_extend_it_runs():
    # The extend after a drafting step covers the bonus token (and the chain's last draft
    # when all are accepted): 2 rows a request at most, not the verify window.
    costs = CostModel(
        target=ForwardCost(probe_rows=(1, 64), probe_ms=(100.0, 100.0)),
        draft=ForwardCost(probe_rows=(1, 2, 10), probe_ms=(40.0, 40.0, 80.0)),
    )  # fmt: skip
    drafter = model_drafting(AdaptiveConfig(buckets=((1, (0, 4)),), explore_share=0.0), costs=costs)
    assert drafter.costs.modelled_ms(1, 5) == 100.0 + 3 * 40.0 + 40.0
    assert drafter.costs.modelled_ms(5, 5) == 100.0 + 3 * 55.0 + 80.0  # forwards of 5 rows, an extend of 10
    drafter.__dict__["deferred"] = None  # SGLang's extend over the window: 5 rows at batch 1
    assert drafter.costs.modelled_ms(1, 5) == 100.0 + 3 * 40.0 + 55.0


def test_an_adaptive_chains_budgets_stop_at_the_chain_length():
    worker, _ = _confident_worker()  # a 3-step chain; the config offers budgets up to 7
    worker.policy.config = worker.drafter.config = AdaptiveConfig(buckets=((1, (0, 2, 5, 7)),), explore_share=0.0)
    assert worker.policy.candidate_budgets(2) == (0, 2, 3)
    worker.drafter.model = draft_model(max_steps=3, topk=2)  # a tree: as configured
    assert worker.policy.candidate_budgets(2) == (0, 2, 5, 7)


# -- the draft's confidence ---------------------------------------------------------------------


def _confident_worker(deferred: bool = True):
    """A 3-step chain whose draft is right when sure and wrong when not; its last extend was
    sure (0.97) of request 0's first draft and unsure (0.2) of request 1's."""
    config = AdaptiveConfig(buckets=((1, (0, 1, 2, 3)),), explore_share=0.0)
    model = draft_model(max_steps=3, extend_after_verify=lambda batch, result: None)
    worker = model_worker(config, model, deferred=deferred)
    for _ in range(200):
        worker.drafter.first_calibration.observe(0.97, accepted=True)
        worker.drafter.first_calibration.observe(0.2, accepted=False)
    step = batch(2, spec_info=SimpleNamespace(topk_p=torch.tensor([[0.97], [0.2]]), topk_index=torch.tensor([[11], [22]])))
    return worker, step


def test_the_draft_models_confidence_shapes_each_requests_budget():
    worker, step = _confident_worker()
    sizes = decide(worker, step).sizes
    assert sizes[0] > 1 and sizes[1] == 1  # the sure request drafts, the unsure one does not
    # A stale top-k (a deferred extend) says nothing: the plan falls back to the running
    # acceptance of first drafts.
    worker.drafter.deferred.backlog.add(["r0"], [3])
    assert worker.drafter.first_acceptance(step, [0.5, 0.4]) == [0.5, 0.4]


def test_after_a_catch_up_the_plan_is_made_again_with_the_fresh_confidence():
    worker, step = _confident_worker()
    planned = decision(step, worker.requests, StepPlan(4, (3, 3), 2.0, 0.0), ps=(0.9, 0.9), firsts=(0.9, 0.9))
    fresh = worker.drafter.first_acceptance(step, list(planned.firsts))
    assert worker.policy.replan(planned, fresh).sizes[1] == 1  # the unsure request's chain is cut
    exploring = dataclasses.replace(planned, plan=StepPlan(2, (1, 1), 2.0, 0.0), exploring=True)
    assert worker.policy.replan(exploring, fresh).sizes == [2, 2]  # an exploring step keeps its plan


def test_verify_tells_the_calibration_whether_each_draft_was_the_targets_token():
    worker, step = _confident_worker(deferred=False)
    drafter = worker.drafter
    drafter.first_calibration = FirstDraftCalibration()
    chain, plain = DraftTree((5, 11), (-1, 0)), DraftTree((6,), (-1,))
    notes = chains.note_drafts(step, [chain, None], None)  # the second request drafted nothing
    assert notes == ([(pytest.approx(0.97), 11)], None)
    proposal = ModelProposal((chain, plain), "extend", decision(step), drafts=notes)
    result = SimpleNamespace(
        next_token_ids=torch.tensor([11, 7, 9, 9]), accept_lens=torch.tensor([2, 1]), speculative_num_draft_tokens=2
    )
    drafter.draft_extend(step, result, proposal, worker.policy)
    assert drafter.first_calibration.info()["weight"][-1] == 1.0
    assert drafter.first_calibration.rate(0.97, prior=0.0) == pytest.approx(1 / 5)  # 1 accepted, prior weight 4
    assert drafter.step_log_fields(proposal)["first_draft_q"] == [0.97, None]
    # A chain that stopped by the draft's confidence: each depth verify reached is observed
    # with the draft's probability of it, up to the first miss (0.6 right, 0.3 wrong, 0.1 unseen).
    stop = ChainStop([0.9, 0.9], [0.97, None], drafter.first_calibration, lambda depth: 100.0 + 50 * depth, 0.0)
    stop.observe([0.6, 0.5])
    stop.observe([0.3, 0.5])
    stop.observe([0.1, 0.5])
    chain = DraftTree((5, 11, 12, 13, 14), (-1, 0, 1, 2, 3))
    proposal = ModelProposal((chain, plain), "extend", decision(step), drafts=chains.note_drafts(step, [chain, None], stop))
    row = [11, 12, 99, 0, 0]
    drafter.draft_extend(step, SimpleNamespace(
        next_token_ids=torch.tensor(row + [7, 0, 0, 0, 0]), accept_lens=torch.tensor([3, 1]), speculative_num_draft_tokens=5,
    ), proposal, worker.policy)  # fmt: skip
    info = drafter.first_calibration.info()
    assert info["weight"] == [0.0, 1.0, 1.0, 0.0, 0.0, 2.0]  # 0.97 again (decayed 1.99), 0.3, 0.6
    assert info["accept_rate"][1:3] == [0.0, 1.0]


# -- the SoT context instead of the draft model -----------------------------------------------


def _long_match_worker():
    worker, step = _confident_worker(deferred=False)
    # A 3-step chain planned for both requests: 2 draft forwards of 40 ms in a 300 ms step.
    planned = decision(step, worker.requests, StepPlan(width=4, budgets=(3, 3), expected_tokens=2 * 2.5, step_ms=300.0))
    return worker.drafter, step, planned


def test_the_context_alone_drafts_when_its_long_matches_have_proven_as_good():
    drafter, _, planned = _long_match_worker()
    both = ([5, 6, 7], [8, 9, 10])
    for _ in range(20):  # long-match context chains have been right all the way
        drafter.long_match_stats.observe(chains.LONG_MATCH, 3, 3)
    assert chains.context_pays(drafter, [4, 4], both, planned)  # ~4 tokens each in 220 ms beats 2.5 in 300 ms
    # One request without a long match: the draft runs anyway.
    assert not chains.context_pays(drafter, [4, 4], ([5, 6, 7], None), planned)
    for _ in range(40):  # ... and once they are mostly wrong, the draft model drafts again
        drafter.long_match_stats.observe(chains.LONG_MATCH, 3, 0)
    assert not chains.context_pays(drafter, [4, 4], both, planned)


def test_long_match_chains_are_scored_against_the_committed_tokens_censored_at_the_accept_length():
    drafter, step, planned = _long_match_worker()
    trees = (DraftTree((4,), (-1,)), DraftTree((7,), (-1,)))
    proposal = ModelProposal(trees, "context", planned, long_match=([5, 6, 7], [8, 9, 10]))
    # Request 0 committed 5, 6 (all it committed agreed: beyond is unknown); request 1
    # committed 8, 1, 2 (the chain's second token was wrong).
    result = SimpleNamespace(next_token_ids=torch.tensor([5, 6, 0, 0, 8, 1, 2, 0]),
                             accept_lens=torch.tensor([2, 3]), speculative_num_draft_tokens=4)  # fmt: skip
    drafter.draft_extend(step, result, proposal, None)
    acc, miss = drafter.long_match_stats._counts[chains.LONG_MATCH]
    # One step: its two chains' counts add up, undecayed by each other.
    assert (acc, miss) == pytest.approx((2 + 1, 1.0))


# -- runner-ups ----------------------------------------------------------------------------------


def _with_runner_ups(worker, step, seeds, reach):
    """Runner-ups for a step that planned the chains `seeds` (trees of 4 and 3 nodes)."""
    return chains.with_runner_ups(worker.drafter, step, seeds, [4, 3], reach, worker.policy)


def test_runner_ups_join_chains_where_rows_are_free_and_acceptance_learns_the_chain_alone():
    ups = RunnerUps()
    worker = model_worker(AdaptiveConfig(buckets=((1, (0, 1, 2, 3)),), explore_share=0.0), draft_model(3, runner_ups=ups))
    drafter, step = worker.drafter, batch(2)
    drafter.window = 6
    # r0 drafted 1, 2, 3 (second choices 41 at depth 1, 42 and 43 from the two forwards);
    # r1's last extend put another token first: its first runner-up is unknown, so none.
    ups.first.update({"r0": (1, 41, 0.2), "r1": (9, 19, 0.3)})
    ups.by_forward.extend([[(42, 0.1), (52, 0.1)], [(43, 0.05), (53, 0.1)]])
    stop = ChainStop([0.8, 0.8], [0.9, 0.9], FirstDraftCalibration(), lambda depth: 100.0 + 40 * depth, 0.0)
    stop.observe([0.7, 0.7])
    stop.observe([0.6, 0.6])
    chain = DraftTree((7, 1, 2, 3), (-1, 0, 1, 2))
    other = DraftTree((8, 5, 6), (-1, 0, 1))
    seeds, sizes, chain_drafts, width = _with_runner_ups(worker, step, [chain, other], stop.reach)
    # Rows are free (the target costs 100 ms at 1-64 rows), and the window holds 6 nodes:
    # r0's chain of 4 takes its two best runner-ups (depth 1's 0.2, then depth 2's).
    assert seeds[1] == other and sizes[1] == 3
    assert seeds[0].size == sizes[0] == 6 and set(seeds[0].tokens) == {7, 1, 2, 3, 41, 42}
    proposal = ModelProposal(tuple(seeds), "extend", decision(step), chains=chain_drafts, chain_width=width)
    assert proposal.priced_width(6) == 4
    assert drafter.runner_up_counts == {"steps": 1, "verified": 2, "accepted": 0}
    # Verify took r0's runner-up at depth 2 (1, 42, then the bonus): its chain was right once;
    # r1's chain was right twice.
    result = SimpleNamespace(next_token_ids=torch.tensor([1, 42, 77, 0, 0, 0, 5, 6, 88, 0, 0, 0]),
                             accept_lens=torch.tensor([3, 3]), speculative_num_draft_tokens=6)  # fmt: skip
    assert drafter.accept(step.reqs, read_committed(result), proposal).accepted == (1, 2)
    assert drafter.runner_up_counts["accepted"] == 1
    # Nothing to add where the cost model prices every row: 1,000 ms a row more.
    drafter.cost.target = ForwardCost(probe_rows=(1, 64), probe_ms=(100.0, 64000.0))
    seeds, sizes, chain_drafts, width = _with_runner_ups(worker, step, [chain, other], stop.reach)
    assert seeds == [chain, other] and sizes == [4, 3] and chain_drafts is None and width is None
    # An exploring step (no ChainStop) reaches depths at the plan's estimates.
    exploring = decision(step, ps=(0.5, 0.8), firsts=(0.9, 0.6), exploring=True)
    assert chains.planned_reach([chain, None], exploring) == [pytest.approx([0.9, 0.45, 0.225]), []]


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (draft_model(), None),
        (draft_model(variable_steps=False), "drafts whole chains"),
        (draft_model(topk=2), "is a tree"),
    ],
    ids=["cpu-chain", "graphs-chain", "tree"],
)
def test_a_fixed_chain_is_logged_and_reported_never_silent(model, reason, caplog):
    drafter = model_drafting(AdaptiveConfig.default(WINDOW - 1), model=model)
    del drafter.__dict__["deferred"]  # decided from the backend, as at a server's first prefill
    got = drafter.fixed_chain_reason
    assert (got is None) == (reason is None) and (reason is None or reason in got)
    assert ("deferred draft-extend are off" in caplog.text) == (reason is not None)
    if reason is not None:
        assert drafter.deferred is None  # off with the adaptive chain
        assert drafter.report()["fixed_chain"] == got


def test_the_context_alone_takes_the_step_where_its_own_plan_commits_more_per_ms():
    """A draft unsure of everything plans a plain step; the SoT context, whose shadow drafts
    were right all the way, plans its own and drafts instead, and what that step accepts
    teaches the context's policy, not the model's."""
    from sglang_specsot.speculative.drafters.context_alone import ContextAlone
    from sglang_specsot.speculative.policy.values import Verified

    worker, step = _confident_worker(deferred=False)
    drafter = worker.drafter
    drafter.alone = ContextAlone(drafter.context, drafter.config, WINDOW)
    worker.planners = {"main": worker.policy, **drafter.policies()}
    step.spec_info.topk_p = torch.tensor([[0.2], [0.2]])  # unsure: calibrated to rejection
    model_decision = decide(worker, step)
    assert model_decision.plan.width == 1 and model_decision.planner == "main"
    view = model_decision.view
    for _ in range(30):  # shadows: the context's trees were right to the end
        drafter.alone.learn_shadows(view, [(0, 3, 3), (1, 3, 3)])
    alone = drafter.alone.decide(view)
    assert alone.planner == "context" and alone.plan.width > 1 and drafter.alone.beats(alone, model_decision)
    assert not drafter.alone.beats(alone, dataclasses.replace(model_decision, exploring=True))  # the model learns
    trees = (DraftTree((1, 2, 3), (-1, 0, 1)), DraftTree((4, 5, 6), (-1, 0, 1)))
    drafter.alone.trees = lambda batch, decision: trees  # the context's trees, without histories
    proposal = drafter.draft(step, model_decision, worker.policy)
    assert proposal.trees == trees and proposal.decision.planner == "context" and proposal.source == "context"
    # Verify accepted both drafts of each tree: the context's policy learns it, the model's does not.
    before_main, before_ctx = worker.policy.steps, drafter.alone.policy.steps
    result = SimpleNamespace(next_token_ids=torch.tensor([2, 3, 9, 5, 6, 9]), accept_lens=torch.tensor([3, 3]),
                             speculative_num_draft_tokens=3, new_seq_lens=None)  # fmt: skip
    worker.draft_extend(step, result, proposal)
    assert (worker.policy.steps, drafter.alone.policy.steps) == (before_main, before_ctx + 1)
    # On the model's own steps the context's shadows go to the context's policy only.
    verified = drafter.accept(step.reqs, read_committed(result), ModelProposal(trees, "extend", model_decision))
    assert verified.shadows == () and isinstance(verified, Verified)
