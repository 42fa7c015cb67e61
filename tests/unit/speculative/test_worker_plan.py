"""The worker's step plan: plain steps while drafts do not pay, and now and then a step that
drafts, so the acceptance estimates can learn again (exploring, `explore_share`)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from sglang_specsot.costs.cost_model import CostModel, ForwardCost, StepCostTable
from sglang_specsot.speculative.context_draft import ContextDrafter
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.policy.acceptance import ChainAcceptance
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.runs import DraftingRuns, ExploreFund
from sglang_specsot.speculative.shadow import ShadowDrafts
from sglang_specsot.speculative.worker import (
    FIXED_WINDOW_ENV,
    SpecSoTWorker,
    adaptive_config,
    budget_mode,
)


def _worker(config: AdaptiveConfig) -> SpecSoTWorker:
    # The plan needs the policy's state only, no SGLang: build the worker without __init__.
    worker = SpecSoTWorker.__new__(SpecSoTWorker)
    # Rows cost in proportion (a verify of w rows costs w plain steps): drafts never pay.
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 2), probe_ms=(100.0, 200.0)))
    worker.adaptive = config
    worker.stats = ChainAcceptance(config)
    worker._tags, worker._last_plan, worker._plain_steps, worker._explored, worker._hopeless, worker._unrepaid = {}, None, 0, 0, 0, 0
    worker._steps, worker._draft_source, worker.by_depth = 0, "context", {}
    worker._step_log, worker.drafter, worker.step_costs, worker._trace = None, ContextDrafter(), StepCostTable(), None
    worker.shadows, worker.drafting_runs = ShadowDrafts(), DraftingRuns()
    worker.explore_fund = ExploreFund(config.explore_share)
    return worker


def _exploring_worker(config: AdaptiveConfig) -> SpecSoTWorker:
    """`_worker` learning only from drafted steps (as with a draft model): it explores."""
    worker = _worker(config)
    worker._learns_from_shadows = lambda: False
    return worker


def _warm(worker, role: str = "plain", key: str = "earlier") -> None:
    """The server has verified drafts of `role` on enough steps not to be cold for it (each
    missed both of its 2 drafts)."""
    for _ in range(worker.adaptive.cold_verifies):
        worker.stats.observe(key, 2, 0, role)


def _batch(n: int):
    return SimpleNamespace(reqs=[SimpleNamespace(rid=f"r{i}") for i in range(n)])


def test_a_batch_that_stopped_drafting_explores_within_its_time_share():
    # A group without evidence is at p = 0.1: drafts do not pay at its estimate, but would
    # at explore_p (0.8), so the batch explores.
    config = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25, prior_accepts=0.1, prior_misses=0.9)
    worker, batch = _exploring_worker(config), _batch(2)
    _warm(worker)  # the server has verified drafts before (not cold)
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 2), probe_ms=(100.0, 120.0)))  # 20 ms a row more
    widths = [max(worker._tree_sizes(batch)) for _ in range(24)]
    # A plain step of 2 rows costs 120 ms, an exploring one (2 drafts, 3 rows per request)
    # 200 ms, 80 ms more: at a 25% share, one step in 3 explores (2 plain steps take 240 ms
    # and 80 ms is a third of it, more than a quarter: so every third step, 3 x 30 ms >= 80).
    assert widths == ([1] * 2 + [3]) * 8
    assert worker._explored == widths.count(3) and worker._hopeless == 0
    report = worker.speculative_state_report()["specsot"]
    assert report["exploring_steps"] == worker._explored and report["memory"]["drafter"]["requests"] == 0


def test_a_server_that_never_verified_a_draft_explores_at_once():
    # The same batch on a cold server: its estimate is the blind prior, so the first plain
    # step explores instead of waiting for the schedule (every third step).
    config = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25, prior_accepts=0.1, prior_misses=0.9)
    worker, batch = _exploring_worker(config), _batch(2)
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 2), probe_ms=(100.0, 120.0)))
    assert worker._tree_sizes(batch) == [3, 3] and worker._exploring and worker._explored == 1
    worker.stats.observe("r0", 2, 0, "plain")  # verify saw both drafts miss
    worker.stats.observe("r1", 2, 0, "plain")
    # One step is no verdict: it stays cold until cold_verifies (4) drafted verifies.
    assert worker.stats.verifies("plain") == 2 < config.cold_verifies
    assert worker._tree_sizes(batch) == [3, 3] and worker._explored == 2
    worker.stats.observe("r0", 2, 0, "plain")
    worker.stats.observe("r1", 2, 0, "plain")
    assert [max(worker._tree_sizes(batch)) for _ in range(6)] == [1, 1, 3] * 2  # on schedule now


def test_a_fresh_server_whose_first_drafts_missed_learns_before_it_gives_up():
    # A fresh server's first step drafted from a low-confidence token and missed, and
    # exploring once has spent the fund: without cold_verifies it would draft nothing more for
    # hundreds of steps, planning from a first-draft estimate built on one miss.
    config = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25)
    worker, batch = _exploring_worker(config), _batch(1)
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 2), probe_ms=(100.0, 120.0)))
    worker.stats.observe("r0", 2, 0, "plain")
    worker.explore_fund.charge(-200.0)
    assert worker._tree_sizes(batch) == [3] and worker._exploring  # cold: funded or not
    assert worker.explore_fund.unfunded == 0
    worker.stats.observe("r0", 2, 2, "plain")  # what exploring finds: the drafts accept
    assert max(worker._tree_sizes(batch)) > 1 and not worker._exploring  # the plan drafts now
    # With cold_verifies=1, that first miss is the verdict: the fund spent, nothing explored.
    worker = _exploring_worker(dataclasses.replace(config, cold_verifies=1))
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 2), probe_ms=(100.0, 120.0)))
    worker.stats.observe("r0", 2, 0, "plain")
    worker.explore_fund.charge(-200.0)
    assert {max(worker._tree_sizes(batch)) for _ in range(50)} == {1}


def test_no_exploring_where_drafting_could_not_pay_even_at_explore_p():
    # Rows cost in proportion (a verify of w rows costs w plain steps): no acceptance below
    # 1 makes a draft pay, so what exploring would learn could never change a plan.
    config = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25)
    worker, batch = _exploring_worker(config), _batch(2)
    assert {max(worker._tree_sizes(batch)) for _ in range(24)} == {1}
    # Exploring was due every 8th step (400 ms extra against a 25% share of 200 ms steps).
    # The server is cold throughout (it never drafts), yet only those turns count as skipped.
    assert worker._explored == 0 and worker._hopeless == 3
    assert worker.speculative_state_report()["specsot"]["exploring_skipped"] == 3
    # Where rows cost a fifth of a plain step, 2 drafts at p = 0.8 bring 2.44 tokens per
    # request in 200 ms against plain's 1 in 120: 1.46x, more than the 25% exploring costs.
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 2), probe_ms=(100.0, 120.0)))
    assert worker._worth_exploring(2)
    worker.adaptive = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25, explore_p=0.3)
    assert not worker._worth_exploring(2)  # 1.3 tokens per 200 ms: 0.78x
    worker.adaptive = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25, explore_p=None)
    assert worker._worth_exploring(2)  # null: on schedule, whatever the costs say


def test_without_speculative_adaptive_every_budget_is_weighed(monkeypatch, tmp_path):
    monkeypatch.delenv(FIXED_WINDOW_ENV, raising=False)
    args = SimpleNamespace(speculative_adaptive=False, speculative_adaptive_config=None)
    config = adaptive_config(args, 5)
    assert budget_mode(args) == "adaptive" and config.candidates(1) == config.candidates(64) == (0, 1, 2, 3, 4, 5)
    worker, batch = _worker(config), _batch(2)
    # Rows cost in proportion: no draft pays, so every step is a plain decode.
    assert {max(worker._tree_sizes(batch)) for _ in range(8)} == {1}
    # Rows free: each request drafts until its next draft is unlikely (p = 0.5 without
    # evidence: 0.5^5 < min_token_prob 0.05, so 4 drafts and the root).
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 64), probe_ms=(100.0, 100.0)))
    assert worker._tree_sizes(batch) == [5, 5] and worker._last_plan.budgets == (4, 4)
    report = worker.speculative_state_report()["specsot"]
    assert report["budget_mode"] == "adaptive" and report["adaptive"] is True
    # A config file is SGLang's: it is read with --speculative-adaptive, as SGLang reads it,
    # and refused without the flag rather than silently dropped.
    path = tmp_path / "adaptive.json"
    path.write_text('{"1": {"candidate_steps": [0, 2]}}')
    alone = SimpleNamespace(speculative_adaptive=False, speculative_adaptive_config=str(path))
    with pytest.raises(ValueError, match=r"read only with --speculative-adaptive: add --speculative-adaptive"):
        adaptive_config(alone, 5)
    with_flag = SimpleNamespace(speculative_adaptive=True, speculative_adaptive_config=str(path))
    assert adaptive_config(with_flag, 5).candidates(8) == (0, 2)


def test_the_fixed_window_is_asked_for_in_the_environment(monkeypatch):
    args = SimpleNamespace(speculative_adaptive=False, speculative_adaptive_config=None)
    monkeypatch.setenv(FIXED_WINDOW_ENV, "1")
    assert budget_mode(args) == "fixed" and adaptive_config(args, 5) is None
    # --speculative-adaptive wins over it: the flag is the user's explicit choice.
    adaptive = SimpleNamespace(speculative_adaptive=True, speculative_adaptive_config=None)
    assert budget_mode(adaptive) == "adaptive" and adaptive_config(adaptive, 5).candidates(1) == (0, 1, 2, 3, 4, 5)
    monkeypatch.setenv(FIXED_WINDOW_ENV, "yes")
    with pytest.raises(ValueError, match=r"SGLANG_SPECSOT_FIXED_WINDOW='yes': set it to 1"):
        budget_mode(args)


def test_acceptance_by_depth_is_split_by_where_the_chain_started():
    worker = _worker(AdaptiveConfig(buckets=((1, (0, 2, 4)),)))
    chain = DraftTree((7, 8, 9, 10), (-1, 0, 1, 2))  # root + a chain of 3 drafts
    worker._step_trees = (chain, chain)
    worker._draft_source = "catch_up"
    worker._observe_acceptance(("a", "b"), [4, 1], [[8, 9, 10, 5], [3]])  # a: all 3 drafts and the bonus; b: none
    worker._draft_source = "extend"
    worker._step_trees = (chain,)
    worker._observe_acceptance(("a",), [2], [[8, 4]])
    report = worker.speculative_state_report()["specsot"]["acceptance_by_depth"]
    assert report == {
        "catch_up": {"p_by_depth": [0.5, 1.0, 1.0], "reached": [2, 1, 1], "accepted": [1, 1, 1]},
        "extend": {"p_by_depth": [1.0, 0.0, None], "reached": [1, 1, 0], "accepted": [1, 0, 0]},
    }


def test_context_drafts_are_planned_from_their_first_and_later_acceptance_apart():
    # Batch 1 on this CPU: a step 109 ms, each row 2.5 ms more. The first context draft is
    # right a quarter of the time, a later one 4 times in 7 given its parent: the chain
    # reaches 0.25, 0.14, 0.08, 0.05, so it drafts 3 tokens. One p for every depth fitted
    # to the same verifies (0.35) reaches 0.35, 0.12, 0.04: 2 tokens, the third cut by
    # min_token_prob though it pays.
    # (A slow decay, so that the estimates settle at the verifies' means.)
    worker, batch = _worker(AdaptiveConfig(buckets=((1, (0, 1, 2, 3, 4, 5)),), decay=0.01)), _batch(1)
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 2), probe_ms=(109.0, 111.5)))
    for _ in range(40):
        for accepted in (0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 2):
            worker._observe("r0", "context", 3, accepted)
    assert worker.stats.first("r0") == pytest.approx(0.25, abs=0.02)
    assert worker.stats.p("r0") == pytest.approx(4 / 7, abs=0.02)
    assert worker._tree_sizes(batch) == [4] and worker._last_plan.budgets == (3,)
    assert worker._last_firsts == [worker.stats.first("r0")] and worker._last_ps == [worker.stats.p("r0")]


def test_no_exploring_when_its_share_is_zero():
    worker, batch = _exploring_worker(AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.0)), _batch(2)
    assert {max(worker._tree_sizes(batch)) for _ in range(30)} == {1}


def test_a_drafting_step_resets_the_count():
    worker, batch = _exploring_worker(AdaptiveConfig(buckets=((1, (0, 2)),), explore_share=0.25)), _batch(1)
    for _ in range(5):
        worker._tree_sizes(batch)
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 64), probe_ms=(100.0, 100.0)))  # rows now free
    assert max(worker._tree_sizes(batch)) == 3 and worker._plain_steps == 0


def _model_worker(config: AdaptiveConfig):
    from sglang_specsot.speculative.extend_backlog import ExtendBacklog
    from sglang_specsot.speculative.model_worker import SpecSoTModelWorker

    worker = SpecSoTModelWorker.__new__(SpecSoTModelWorker)
    # Rows free to 64 for both; a draft forward costs 40 ms, a target forward 100 ms, and a
    # draft-extend of more than 64 rows grows 10 ms a row.
    target = ForwardCost(probe_rows=(1, 64), probe_ms=(100.0, 100.0))
    worker.cost = CostModel(target=target, draft=ForwardCost(probe_rows=(1, 64, 65), probe_ms=(40.0, 40.0, 50.0)))
    worker.adaptive, worker.stats = config, ChainAcceptance(config)
    worker._tags, worker._last_plan, worker._plain_steps, worker._explored, worker._hopeless, worker._unrepaid = {}, None, 0, 0, 0, 0
    worker._steps, worker._draft_source, worker.by_depth = 0, "context", {}
    worker.step_costs, worker._step_log, worker.drafter, worker._trace = StepCostTable(), None, ContextDrafter(), None
    worker.__dict__["backlog"] = ExtendBacklog()  # what the cached property gives on a CPU chain
    worker.drafting_runs, worker.explore_fund = DraftingRuns(), ExploreFund(config.explore_share)
    worker._chain_steps = lambda width: width - 1  # a chain as long as the budget
    worker._min_budget = lambda: 0  # an adaptive chain may be cut to nothing
    return worker


def test_a_plain_step_with_a_deferred_extend_costs_the_target_alone():
    worker = _model_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
    worker.backlog.add(["a"], [80])  # the step alone: its catch-up is weighed apart (_setup_repaid)
    step_ms = worker._step_ms
    assert step_ms(1, 1) == 100.0  # no extend on a plain step
    assert step_ms(1, 2) == 100.0 + 40.0  # one draft (read from the last extend) and its extend


def test_the_step_log_records_what_the_policy_chose_and_what_verify_accepted(tmp_path, monkeypatch):
    import json

    import torch

    from sglang_specsot.speculative import step_log

    monkeypatch.setenv(step_log.ENV, str(tmp_path / "steps.jsonl"))
    worker = _worker(AdaptiveConfig(buckets=((1, (0, 2, 4)),)))
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 64), probe_ms=(100.0, 100.0)))  # rows free
    worker._step_log, batch = step_log.StepLog.from_env(), _batch(2)
    sizes = worker._tree_sizes(batch)
    worker._step_trees = tuple(DraftTree(tuple(range(n)), tuple(range(-1, n - 1))) for n in sizes)
    result = SimpleNamespace(accept_lens=torch.tensor([3, 1]), speculative_num_draft_tokens=max(sizes))
    phases = {"draft": 1.0, "verify": 100.0, "draft_extend": 22.4, "target_forward": 95.0}
    worker._step_log.write(worker._step_record(result, 123.4, explored=False, phase_ms=phases))
    (line,) = (tmp_path / "steps.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["bs"] == 2 and record["ps"] == [0.5, 0.5] and record["width"] == max(sizes) > 1
    assert record["budgets"] == record["drafted"] == [n - 1 for n in sizes]
    assert record["accepted"] == [2, 0] and record["step_ms"] == 123.4 and record["explored"] is False
    assert record["expected_ms"] == 100.0 and record["cost"] == {"target_overhead_ms": 0.0}
    assert record["draft_extend"] is None and record["candidates"]["1"] == [2.0, 100.0]
    assert record["phase_ms"] == phases


def test_no_step_log_without_its_environment_variable(monkeypatch):
    from sglang_specsot.speculative import step_log

    monkeypatch.delenv(step_log.ENV, raising=False)
    assert step_log.StepLog.from_env() is None


def _confident_worker():
    import torch

    from sglang_specsot.speculative.policy.acceptance import FirstDraftCalibration

    config = AdaptiveConfig(buckets=((1, (0, 1, 2, 3)),), explore_share=0.0)
    worker = _model_worker(config)
    worker._draft_worker = SimpleNamespace(topk=1, variable_steps=True, max_steps=3)  # what bind_workers sets
    worker.first_calibration = FirstDraftCalibration()
    for i in range(200):  # this draft model is right when sure and wrong when not
        worker.first_calibration.observe(0.97, accepted=True)
        worker.first_calibration.observe(0.2, accepted=False)
    worker._step_drafts = worker._last_drafts = None
    worker._step_log, worker._exploring, worker.drafter = None, False, ContextDrafter()
    batch = _batch(2)
    batch.spec_info = SimpleNamespace(topk_p=torch.tensor([[0.97], [0.2]]), topk_index=torch.tensor([[11], [22]]))
    return worker, batch


def test_the_draft_models_confidence_shapes_each_requests_budget():
    worker, batch = _confident_worker()
    sizes = worker._tree_sizes(batch)
    assert sizes[0] > 1 and sizes[1] == 1  # the sure request drafts, the unsure one does not
    # A stale top-k (a deferred extend) says nothing: the plan falls back to the running
    # acceptance of first drafts.
    worker.backlog.add(["r0"], [3])
    assert worker._first_draft_acceptance(batch, [0.5, 0.4]) == [0.5, 0.4]


def test_after_a_catch_up_the_plan_is_made_again_with_the_fresh_confidence():
    worker, batch = _confident_worker()
    worker._last_ps = worker._last_firsts = [0.9, 0.9]
    assert worker._replan(batch, [4, 4])[1] == 1  # the unsure request's chain is cut
    worker._exploring = True
    assert worker._replan(batch, [2, 2]) == [2, 2]  # an exploring step keeps its plan


def test_verify_tells_the_calibration_whether_each_draft_was_the_targets_token():
    import torch

    from sglang_specsot.speculative.policy.chains import ChainStop

    worker, batch = _confident_worker()
    worker.first_calibration = type(worker.first_calibration)()
    chain = DraftTree((5, 11), (-1, 0))
    worker._note_drafts(batch, [chain, None], None)  # the second request drafted nothing
    assert worker._step_drafts == [[(pytest.approx(0.97), 11)], None]
    result = SimpleNamespace(
        next_token_ids=torch.tensor([11, 7, 9, 9]), accept_lens=torch.tensor([2, 1]), speculative_num_draft_tokens=2
    )
    worker._observe_drafts(result)
    assert worker.first_calibration.info()["weight"][-1] == 1.0
    assert worker.first_calibration.rate(0.97, prior=0.0) == pytest.approx(1 / 5)  # 1 accepted, prior weight 4
    assert worker._step_drafts is None and worker._first_draft_q() == [0.97, None]
    # A chain that stopped by the draft's confidence: each depth verify reached is observed
    # with the draft's probability of it, up to the first miss (0.6 right, 0.3 wrong, 0.1 unseen).
    stop = ChainStop([0.9, 0.9], [0.97, None], worker.first_calibration, lambda depth: 100.0 + 50 * depth, 0.0)
    stop.observe([0.6, 0.5])
    stop.observe([0.3, 0.5])
    stop.observe([0.1, 0.5])
    chain = DraftTree((5, 11, 12, 13, 14), (-1, 0, 1, 2, 3))
    worker._note_drafts(batch, [chain, None], stop)
    row = [11, 12, 99, 0, 0]
    worker._observe_drafts(SimpleNamespace(
        next_token_ids=torch.tensor(row + [7, 0, 0, 0, 0]), accept_lens=torch.tensor([3, 1]), speculative_num_draft_tokens=5,
    ))  # fmt: skip
    info = worker.first_calibration.info()
    assert info["weight"] == [0.0, 1.0, 1.0, 0.0, 0.0, 2.0]  # 0.97 again (decayed 1.99), 0.3, 0.6
    assert info["accept_rate"][1:3] == [0.0, 1.0]


def test_measured_step_times_override_the_model_where_it_prices_a_width_wrong():
    worker = _worker(AdaptiveConfig(buckets=((1, (0, 7)),), explore_share=0.0))
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 64), probe_ms=(100.0, 100.0)))  # rows "free"
    batch = _batch(4)
    width = max(worker._tree_sizes(batch))
    assert width == 5  # by the model a wide window is free (p = 0.5: 4 drafts are worth it)
    for _ in range(3):  # ... but such steps really take 4x a plain one
        worker.step_costs.observe(4, width, 400.0)
    assert worker._step_ms(4, width) == 400.0 and worker._step_ms(4, 1) == 100.0  # the rest: the model
    assert max(worker._tree_sizes(batch)) == 1
    assert worker.speculative_state_report()["specsot"]["measured_step_ms"] == {"4x5": 400.0}


def test_a_context_step_is_priced_no_dearer_than_a_wider_one_measured():
    # A width measured in a slow stretch (139 ms) where a window 4 rows wider took 131: a
    # SoT-context step adds verify rows only, so the narrower one is priced at most 131,
    # and the policy may choose it again. The model's prices are bounded alike.
    worker = _worker(AdaptiveConfig(buckets=((1, (0, 1, 5)),), explore_share=0.0))
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 64), probe_ms=(140.0, 200.0)))
    for _ in range(3):
        worker.step_costs.observe(1, 2, 139.0)
        worker.step_costs.observe(1, 6, 131.0)
    assert worker.step_costs.ms(1, 2) == 139.0 and worker._step_ms(1, 2) == 131.0
    assert worker._step_ms(1, 1) == 131.0  # the model's 140 ms for one row, bounded too
    assert worker._step_ms(1, 6) == 131.0 and worker._step_ms(1, 4) == 131.0
    assert worker._step_ms(2, 1) == worker._modelled_step_ms(2, 1)  # nothing wider measured at 2
    # With a draft model a step's width does not say what ran: no bound.
    chain = _chain_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
    for _ in range(3):
        chain.step_costs.observe(1, 2, 139.0)
        chain.step_costs.observe(1, 6, 131.0)
    assert chain._step_ms(1, 2) == 139.0


def test_an_adaptive_chains_budgets_stop_at_the_chain_length():
    worker, batch = _confident_worker()  # a 3-step chain; the config offers budgets up to 3
    worker.adaptive = AdaptiveConfig(buckets=((1, (0, 2, 5, 7)),), explore_share=0.0)
    assert worker._candidate_budgets(2) == (0, 2, 3)
    worker._draft_worker = SimpleNamespace(topk=2, variable_steps=True, max_steps=3)  # a tree: as configured
    assert worker._candidate_budgets(2) == (0, 2, 5, 7)


def _long_match_worker():
    from sglang_specsot.speculative.policy.acceptance import AcceptanceStats
    from sglang_specsot.speculative.policy.planning import StepPlan

    worker, batch = _confident_worker()
    worker.long_match_stats, worker.draft_model_skips = AcceptanceStats(worker.adaptive), 0
    # A 3-step chain planned for both requests: 2 draft forwards of 40 ms in a 300 ms step.
    worker._last_plan = StepPlan(width=4, budgets=(3, 3), expected_tokens=2 * 2.5, step_ms=300.0)
    worker._chain_steps = lambda width: min(width - 1, 3)
    return worker, batch


def test_the_context_alone_drafts_when_its_long_matches_have_proven_as_good():
    worker, _ = _long_match_worker()
    worker._shadow = [[5, 6, 7], [8, 9, 10]]
    for _ in range(20):  # long-match context chains have been right all the way
        worker.long_match_stats.observe("long_match", 3, 3)
    assert worker._context_pays([4, 4])  # ~4 tokens each in 220 ms beats 2.5 in 300 ms
    worker._shadow = [[5, 6, 7], None]  # one request without a long match: the draft runs anyway
    assert not worker._context_pays([4, 4])
    worker._shadow = [[5, 6, 7], [8, 9, 10]]
    for _ in range(40):  # ... and once they are mostly wrong, the draft model drafts again
        worker.long_match_stats.observe("long_match", 3, 0)
    assert not worker._context_pays([4, 4])


def test_long_match_chains_are_scored_against_the_committed_tokens_censored_at_the_accept_length():
    import torch

    worker, _ = _long_match_worker()
    worker._shadow = [[5, 6, 7], [8, 9, 10]]
    # Request 0 committed 5, 6 (all it committed agreed: beyond is unknown); request 1
    # committed 8, 1, 2 (the chain's second token was wrong).
    result = SimpleNamespace(next_token_ids=torch.tensor([5, 6, 0, 0, 8, 1, 2, 0]),
                             accept_lens=torch.tensor([2, 3]), speculative_num_draft_tokens=4)  # fmt: skip
    worker._observe_long_match_chains(result)
    acc, miss = worker.long_match_stats._counts["long_match"]
    # One step: its two chains' counts add up, undecayed by each other.
    assert (acc, miss) == pytest.approx((2 + 1, 1.0)) and worker._shadow is None


def test_malformed_tags_are_logged_a_bounded_number_of_times(caplog):
    # Each problem text quotes the client's value: a client sending ever new garbage must not
    # grow the scheduler's set of warnings without bound.
    from sglang_specsot.speculative import worker as worker_module

    worker = _worker(AdaptiveConfig.default(4))
    worker._warned = set()
    for i in range(3 * worker_module._MAX_WARNED):
        req = SimpleNamespace(rid=f"r{i}", sampling_params=SimpleNamespace(custom_params={"specsot": {"role": f"junk-{i}"}}))
        assert worker._read_tag(req) is not None
    assert len(worker._warned) == worker_module._MAX_WARNED
    warnings = [r for r in caplog.records if "malformed SoT metadata" in r.getMessage()]
    assert len(warnings) == worker_module._MAX_WARNED and "further malformed" in warnings[-1].getMessage()


def _chain_worker(config: AdaptiveConfig):
    """`_model_worker` with a draft model drafting an adaptive chain of up to 4 tokens."""
    worker = _model_worker(config)
    worker._draft_worker = SimpleNamespace(topk=1, variable_steps=True, max_steps=4)
    return worker


def _deferred_steps(worker, p: float, limit: int = 1000) -> int:
    """Plain steps of one request whose extends the worker defers before it flushes."""
    worker._acceptance = worker._first_acceptance = lambda reqs: [p] * len(reqs)
    batch, deferred = _batch(1), 0
    while deferred < limit:
        worker.backlog.add(["r0"], [1])
        if not worker._defer_extend(batch, ["r0"]):
            return deferred
        deferred += 1
    return deferred


def test_while_drafting_is_far_from_paying_the_backlog_is_not_flushed_for_latency():
    # A plain step costs 100 ms, a one-draft step 140 (its extend): at p=0.3 a draft step's
    # 1.3 tokens per 140 ms is within NEAR_PAYING of plain's 1 per 100, at p=0.01 it is not.
    near = _chain_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
    # Near: flushed once a catch-up would cost more than a plain step and an extend (140 ms;
    # 40 ms to 64 rows, then 10 ms a row): at 74 tokens behind.
    assert _deferred_steps(near, 0.3) == 73
    far = _chain_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
    # Far: nothing flushes it (a backlog costs no memory; drafting again must repay it).
    assert _deferred_steps(far, 0.01) == 1000


def test_exploring_counts_the_catch_up_it_needs_against_its_share():
    def plain_steps_per_explore(worker) -> int:
        batch, ps = _batch(1), [0.01]
        for step in range(1, 100):
            if worker._maybe_explore(batch, ps, worker._plan(ps)).width > 1:
                return step
        raise AssertionError("never explored")

    config = AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.25)
    current = _chain_worker(config)
    _warm(current)  # not a cold server: exploring on schedule
    # An exploring step costs 40 ms more than a plain one: 40 / (0.25 x 100) -> every 2nd.
    assert plain_steps_per_explore(current) == 2
    behind = _chain_worker(config)
    _warm(behind)
    behind.backlog.add(["r0"], [80])
    # Its catch-up over 80 tokens costs 200 ms more (50 ms at 65 rows, 10 ms a row on):
    # 240 / 25 -> every 10th.
    assert plain_steps_per_explore(behind) == 10
    # A server that has never verified a draft explores at its first plain step, catch-up or not.
    cold = _chain_worker(config)
    cold.backlog.add(["r0"], [80])
    assert plain_steps_per_explore(cold) == 1


def test_a_drafting_plan_must_repay_the_catch_up_it_needs_in_the_steps_left():
    def first_width(max_new_tokens: int) -> int:
        worker = _chain_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
        worker._acceptance = worker._first_acceptance = lambda reqs: [0.9] * len(reqs)
        worker.backlog.add(["r0"], [80])  # 80 tokens behind: its catch-up costs 200 ms
        req = SimpleNamespace(rid="r0", output_ids=[1] * 5, sampling_params=SimpleNamespace(max_new_tokens=max_new_tokens))
        width = max(worker._tree_sizes(SimpleNamespace(reqs=[req])))
        assert worker._unrepaid == int(width == 1)  # reported as drafting_not_repaid
        return width

    # One draft at p = 0.9: 1.9 tokens in 140 ms where plain takes 190 ms, 50 ms saved a step.
    assert first_width(max_new_tokens=100) == 2  # 95 tokens left, 50 steps: 2.5 s saved > 200 ms
    assert first_width(max_new_tokens=10) == 1  # 5 tokens left, 2.6 steps: 130 ms saved < 200 ms


def test_the_catch_up_must_be_repaid_within_the_drafting_runs_measured_at_this_batch_size():
    def first_width(runs: list[int], runs_at: str = "1 plain") -> int:
        worker = _chain_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
        worker._acceptance = worker._first_acceptance = lambda reqs: [0.9] * len(reqs)
        for n in runs:  # earlier runs of n drafting steps that paid, each followed by a plain step
            for _ in range(n):
                worker.drafting_runs.step(runs_at, drafted=True, saved_ms=10.0)
            worker.drafting_runs.step(runs_at, drafted=False)
        worker.backlog.add(["r0"], [80])  # its catch-up costs 200 ms
        req = SimpleNamespace(rid="r0", output_ids=[1] * 5, sampling_params=SimpleNamespace(max_new_tokens=100))
        return max(worker._tree_sizes(SimpleNamespace(reqs=[req])))

    # 50 ms saved a step (above), 50 steps left: drafts while runs here last 5 steps or more.
    assert first_width([]) == 2  # no runs measured: the steps left are the horizon
    assert first_width([5, 6, 7]) == 2  # 6 steps x 50 ms = 300 ms > 200 ms
    assert first_width([2, 3, 4]) == 1  # 3 steps x 50 ms = 150 ms < 200 ms: stays plain
    assert first_width([2, 3, 4], runs_at="5 plain") == 2  # runs of another batch size say nothing
    assert first_width([2, 3, 4], runs_at="1 skeleton") == 2  # nor runs of skeletons


def test_a_catch_up_is_priced_at_what_catch_ups_have_really_cost():
    def first_width(real_ms: float, priced_ms: float) -> int:
        worker = _chain_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
        worker._acceptance = worker._first_acceptance = lambda reqs: [0.9] * len(reqs)
        for n in (5, 6, 7):  # runs of ~6 drafting steps, 50 ms saved each: 300 ms repays
            for _ in range(n):
                worker.drafting_runs.step("1 plain", drafted=True, saved_ms=10.0)
            worker.drafting_runs.step("1 plain", drafted=False)
        worker.backlog.count_catch_up(rows=400, ms=real_ms, priced_ms=priced_ms)
        worker.backlog.add(["r0"], [80])  # priced by the model at 200 ms
        req = SimpleNamespace(rid="r0", output_ids=[1] * 5, sampling_params=SimpleNamespace(max_new_tokens=100))
        return max(worker._tree_sizes(SimpleNamespace(reqs=[req])))

    assert first_width(real_ms=4000.0, priced_ms=4000.0) == 2  # priced right: 200 ms < 300 ms
    # Catch-ups took twice their price ((9000 + 1000) / (4000 + 1000)): this one 400 ms > 300 ms.
    assert first_width(real_ms=9000.0, priced_ms=4000.0) == 1


def test_no_catch_up_where_the_runs_begun_at_this_batch_size_cost_more_than_they_saved():
    def first_width(saved_by_run: list[float], runs_at: str = "1 plain") -> int:
        worker = _chain_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
        worker._acceptance = worker._first_acceptance = lambda reqs: [0.9] * len(reqs)
        for saved in saved_by_run:  # earlier runs of 6 drafting steps (long enough to repay, by the plan)
            for i in range(6):
                worker.drafting_runs.step(runs_at, drafted=True, saved_ms=saved if i == 0 else 0.0)
            worker.drafting_runs.step(runs_at, drafted=False)
        worker.backlog.add(["r0"], [80])  # its catch-up costs 200 ms
        req = SimpleNamespace(rid="r0", output_ids=[1] * 5, sampling_params=SimpleNamespace(max_new_tokens=100))
        return max(worker._tree_sizes(SimpleNamespace(reqs=[req])))

    assert first_width([]) == 2  # nothing measured: the plan's 300 ms saved > 200 ms decides
    assert first_width([50.0, -20.0, 10.0]) == 2  # the runs here saved 13 ms each on average
    assert first_width([-150.0, -20.0, 10.0]) == 1  # they cost 53 ms each: stays plain
    assert first_width([-150.0, -20.0, 10.0], runs_at="5 plain") == 2  # runs of another batch size say nothing
    # Without a setup to repay, the plan alone decides, as when nothing is measured (the runs'
    # verdict includes setups).
    worker = _chain_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
    worker._acceptance = worker._first_acceptance = lambda reqs: [0.9] * len(reqs)
    for _ in range(3):
        worker.drafting_runs.step("1 plain", drafted=True, saved_ms=-500.0)
        worker.drafting_runs.step("1 plain", drafted=False)
    plan = worker._plan([0.9])
    assert plan.width == 2 and worker._setup_repaid(_batch(1), plan)  # the backlog is empty


def test_skeletons_runs_and_normal_answers_runs_are_judged_apart():
    # At batch 1 a SoT skeleton (a short plan behind a long prompt) and a normal answer (a
    # long text) save differently from drafting: the verdict of one says nothing of the other.
    from sglang_specsot.sot.tag import SoTTag

    worker = _chain_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
    worker._acceptance = worker._first_acceptance = lambda reqs: [0.9] * len(reqs)
    worker._tags["s0"] = SoTTag(group="g", role="skeleton")
    for _ in range(3):  # skeletons' runs cost more than they saved, catch-ups included
        worker.drafting_runs.step("1 skeleton", drafted=True, saved_ms=-300.0)
        worker.drafting_runs.step("1 skeleton", drafted=False)

    def first_width(rid: str) -> int:
        worker.backlog.add([rid], [80])  # its catch-up costs 200 ms
        req = SimpleNamespace(rid=rid, output_ids=[1] * 5, sampling_params=SimpleNamespace(max_new_tokens=100))
        return max(worker._tree_sizes(SimpleNamespace(reqs=[req])))

    assert first_width("r0") == 2  # a normal answer drafts: the plan's 2.5 s saved > 200 ms
    assert first_width("s0") == 1  # a skeleton stays plain
    reqs = [SimpleNamespace(rid=r) for r in ("s0", "r0", "r1")]
    worker._tags["b0"] = SoTTag(group="g", role="branch", point=0, n=2)
    assert worker._runs_key(reqs) == "3 plain+skeleton" and worker._runs_key(reqs[1:]) == "2 plain"
    assert worker._runs_key([SimpleNamespace(rid="b0")]) == "1 branch"


def test_no_flush_readies_a_run_that_the_measured_runs_say_would_not_pay():
    near = _chain_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
    assert _deferred_steps(near, 0.3) == 73  # near paying: flushed to keep the catch-up short
    losing = _chain_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
    for _ in range(3):
        losing.drafting_runs.step("1 plain", drafted=True, saved_ms=-100.0)
        losing.drafting_runs.step("1 plain", drafted=False)
    assert _deferred_steps(losing, 0.3) == 1000


def test_a_steps_saving_against_plain_decoding():
    worker = _chain_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
    worker._extended = False
    # A plain step of 2 requests costs 100 ms: 50 ms a token.
    worker._step_tokens = 5
    assert worker._saved_ms(2, 180.0, drafted=True) == 5 * 50.0 - 180.0  # 70 ms saved
    assert worker._saved_ms(2, 130.0, drafted=False) == 0.0  # a plain step that deferred: plain decoding
    worker._extended = True
    assert worker._saved_ms(2, 130.0, drafted=False) == -30.0  # it flushed: 30 ms more than plain
    assert worker._saved_ms(2, 90.0, drafted=False) == 0.0  # faster than the estimate: no credit


def test_exploring_waits_while_it_has_spent_more_than_drafting_saved():
    # As in the first test: p = 0.1, drafting pays only at explore_p; one step in 3 explores.
    config = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25, prior_accepts=0.1, prior_misses=0.9)
    worker, batch = _exploring_worker(config), _batch(2)
    _warm(worker)
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 2), probe_ms=(100.0, 120.0)))
    worker.explore_fund.charge(-80.0)  # an exploring step that cost 80 ms more than plain decoding
    widths = [max(worker._tree_sizes(batch)) for _ in range(9)]
    # Every plain step waited, and the schedule did not advance meanwhile.
    assert widths == [1] * 9 and worker._explored == 0 and worker.explore_fund.unfunded == 9
    assert worker._plain_steps == 0
    worker.explore_fund.earn(400.0)  # drafting saved 400 ms: a quarter of it, 100 ms, is exploring's
    widths = [max(worker._tree_sizes(batch)) for _ in range(3)]
    assert widths == [1, 1, 3] and worker._explored == 1
    assert worker.speculative_state_report()["specsot"]["explore_fund"] == {"balance_ms": 20.0, "unfunded": 9}


def test_a_role_little_drafted_for_explores_funded_or_not():
    # The server has drafted only for SoT branches, lost doing so (the fund is spent), and
    # learned they accept nothing. A normal answer (untagged: plain) starts from the server's
    # acceptance, where drafting does not pay: without exploring once it would never learn
    # its own (a normal answer accepts more of a draft model's drafts than branches do).
    from sglang_specsot.sot.tag import SoTTag

    config = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25)
    worker, batch = _exploring_worker(config), _batch(2)
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 2), probe_ms=(100.0, 120.0)))
    worker._tags["b0"] = SoTTag(group="g", role="branch", point=0, n=2)
    for _ in range(20):
        worker.stats.observe("g", 2, 0, "branch")
    worker.explore_fund.charge(-500.0)
    assert worker._tree_sizes(batch) == [3, 3] and worker._explored == 1  # cold for its role
    assert worker.explore_fund.unfunded == 0
    _warm(worker, key="r0")  # what it learned: its drafts missed too
    assert [max(worker._tree_sizes(batch)) for _ in range(3)] == [1, 1, 1]  # now it waits
    assert worker.explore_fund.unfunded == 3
    branches = SimpleNamespace(reqs=[SimpleNamespace(rid="b0")])
    assert max(worker._tree_sizes(branches)) == 1  # the branches' role is known: no exploring


def test_a_cache_flush_forgets_the_groups_not_what_drafting_earns_here():
    # Benchmarks flush the cache between requests; a server that forgot its acceptance then
    # would be cold again at every request, and explore each role anew behind a catch-up.
    worker = _exploring_worker(AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25))
    worker._decode_rids, worker._awaiting_decode = set(), {}
    for _ in range(10):
        worker.stats.observe("r0", 2, 2, "plain")
    prior = worker.stats.priors()["plain"]  # where a new normal answer starts: {"first", "p"}
    assert worker.stats.first("r0", "plain") > prior["first"] > 0.8
    assert worker.stats.p("r0", "plain") > prior["p"] > 0.8
    worker.clear_cache_pool()
    assert worker.stats.has_evidence("plain") and worker.stats.priors()["plain"] == prior
    assert worker.stats.info() == {}  # the group is gone: it starts where a new one would
    assert worker.stats.first("r0", "plain") == pytest.approx(prior["first"], abs=1e-3)
    assert worker.stats.p("r0", "plain") == pytest.approx(prior["p"], abs=1e-3)
    assert not worker._cold(_batch(1))


def test_exploring_on_schedule_whatever_the_costs_is_not_funded_either():
    config = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25, explore_p=None)
    worker, batch = _exploring_worker(config), _batch(2)
    _warm(worker)
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 2), probe_ms=(100.0, 120.0)))
    worker.explore_fund.charge(-1000.0)
    assert [max(worker._tree_sizes(batch)) for _ in range(3)] == [1, 1, 3] and worker.explore_fund.unfunded == 0


def test_a_plain_step_that_flushed_is_not_what_a_plain_step_costs():
    worker = _chain_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
    worker._refresh_costs, worker._extended = True, True
    assert not worker._measures_step_cost(0, width=1)  # a flush: the plan prices plain steps as deferring
    assert worker._measures_step_cost(0, width=2)  # a drafting step extends as its price says
    worker._extended = False
    assert worker._measures_step_cost(0, width=1)  # a plain step that deferred
    worker.backlog.catch_ups = 1
    assert not worker._measures_step_cost(0, width=2)  # a catch-up ran: owed whatever the step
    worker._refresh_costs = False
    assert not worker._measures_step_cost(1, width=1)  # wall-clock means nothing here (a GPU)


def test_a_decode_steps_phase_times_in_the_step_log_are_its_own(tmp_path, monkeypatch):
    # forward_batch_generation with the phases stubbed: each takes a known time, and the step
    # log's phase_ms must show those times (a name reused for the step's "drafted" flag would
    # turn the draft phase's end time into a bool, and the draft phase's time into nonsense).
    import json
    import time

    import torch

    from sglang_specsot.speculative import step_log

    monkeypatch.setenv(step_log.ENV, str(tmp_path / "steps.jsonl"))
    worker = _worker(AdaptiveConfig(buckets=((1, (0, 1)),)))
    worker._step_log, worker._loop_logged, worker._awaiting_decode = step_log.StepLog.from_env(), True, {}
    worker._refresh_costs, worker._exploring, worker._target_ms, worker._last_ps = True, False, 10.0, [0.5]
    worker._last_firsts = [0.5]
    batch = SimpleNamespace(reqs=[SimpleNamespace(rid="r0")], forward_mode=SimpleNamespace(is_decode=lambda: True))
    result = SimpleNamespace(accept_lens=torch.tensor([2]), speculative_num_draft_tokens=2, new_seq_lens=None)

    def draft(batch):
        time.sleep(0.02)
        worker._step_trees, worker._last_plan = (DraftTree((0, 1), (-1, 0)),), worker._plain_plan(1)
        worker._last_candidates = {}
        return SimpleNamespace(draft_token_num=2)

    def verify(batch, verify_input, pp_proxy_tensors=None):
        time.sleep(0.04)
        return result

    def draft_extend(batch, result):
        worker._step_tokens = 2

    worker.draft, worker.verify, worker.draft_extend = draft, verify, draft_extend
    assert worker.forward_batch_generation(batch) is result
    (line,) = (tmp_path / "steps.jsonl").read_text().splitlines()
    phases = json.loads(line)["phase_ms"]
    assert 20.0 <= phases["draft"] < phases["verify"] and 40.0 <= phases["verify"] < 1000.0, phases
    assert 0.0 <= phases["draft_extend"] < phases["draft"] and phases["target_forward"] == 10.0, phases
    assert worker.drafting_runs._length == 1  # the step counted as drafting (a window of 2)
    assert worker.drafting_runs._key == "1 plain"  # under the batch's size and roles


def test_a_batch_without_a_verdict_of_its_own_takes_a_smaller_batchs_losing_one():
    # A draft gains less the more rows a plain step fills: runs that lost at 2 requests
    # would lose at 3. Only a losing verdict passes up, only from smaller batches of the
    # same roles, and a batch's own verdict, once it has one, decides.
    from sglang_specsot.sot.tag import SoTTag

    def worker_with(runs: dict[str, float]):
        worker = _chain_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
        worker._acceptance = worker._first_acceptance = lambda reqs: [0.9] * len(reqs)
        for key, saved in runs.items():  # three runs at `key`, each saving `saved` ms
            for _ in range(3):
                worker.drafting_runs.step(key, drafted=True, saved_ms=saved)
                worker.drafting_runs.step(key, drafted=False)
        for i in range(4):
            worker._tags[f"b{i}"] = SoTTag(group="g", role="branch", point=i, n=4)
        return worker

    def lose(runs: dict[str, float], n: int = 3) -> bool:
        return worker_with(runs)._runs_lose([SimpleNamespace(rid=f"b{i}") for i in range(n)])

    assert not lose({})  # nothing measured anywhere
    assert lose({"3 branch": -100.0})  # its own runs lost
    assert lose({"2 branch": -100.0})  # a smaller batch's did, and it has none
    assert lose({"1 branch": -100.0})  # the nearest smaller batch with a verdict stands in
    assert not lose({"2 branch": -100.0, "3 branch": 50.0})  # its own verdict decides
    assert not lose({"1 branch": -100.0, "2 branch": 50.0})  # the nearer smaller batch paid
    assert not lose({"4 branch": -100.0})  # a larger batch's loss says nothing of a smaller one
    assert not lose({"2 skeleton": -100.0, "2 plain": -100.0})  # nor other roles' runs
    assert lose({"3 branch": -100.0}, n=4) and not lose({"3 branch": -100.0}, n=2)

    # The plan follows it: a 2-request batch behind a catch-up stays plain where 1-request
    # runs lost, and drafts where they paid.
    def first_width(saved: float) -> int:
        worker = worker_with({"1 plain": saved})
        worker._extend_writes_first = False  # no prefix shared in the catch-up: 160 rows
        worker.backlog.add(["r0", "r1"], [80, 80])
        reqs = [SimpleNamespace(rid=f"r{i}", output_ids=[1] * 5, sampling_params=SimpleNamespace(max_new_tokens=100))
                for i in range(2)]  # fmt: skip
        return max(worker._tree_sizes(SimpleNamespace(reqs=reqs)))

    assert first_width(50.0) == 2 and first_width(-100.0) == 1


def _extending_worker(monkeypatch, histories: dict[str, list[int]]):
    """`_chain_worker` whose draft-extend runs for real up to the draft model: the drafter's
    histories are given, the context side of draft_extend does nothing, and the draft
    model's ragged extend records what it was asked (its top-k: the request's index)."""
    import torch

    from sglang_specsot.speculative.draft_kv import DraftKVSlots

    worker = _chain_worker(AdaptiveConfig(buckets=((1, (0, 4)),), explore_share=0.0))
    monkeypatch.setattr(SpecSoTWorker, "draft_extend", lambda self, batch, result: None)
    worker._observe_drafts = worker._observe_long_match_chains = lambda result: None
    worker._history = lambda req: histories[req.rid]
    worker._shared = lambda batch: [0] * len(batch.reqs)
    worker._refresh_costs, worker._fed, worker._topk_source = False, None, "extend"
    worker.__dict__["draft_kv"] = DraftKVSlots(256)
    worker._defer_extend = lambda batch, rids: False
    calls = []

    def extend_ranges(batch, ranges, tokens):
        calls.append((ranges, tokens))
        n = len(ranges)
        return torch.ones(n, 1), torch.arange(n).view(n, 1)

    worker._draft_worker = SimpleNamespace(topk=1, variable_steps=True, max_steps=4, extend_ranges=extend_ranges)
    return worker, calls


def _verified(seq_lens: list[int], rows: list[list[int]], accept_lens: list[int]):
    """A decode batch after verify: positions [seq_len, seq_len + k) of each request committed,
    `rows` the verify's tokens (row-major, n per request) and `k` of each accepted."""
    import torch

    bs, n = len(rows), len(rows[0])
    pool = SimpleNamespace(req_to_token=torch.arange(2 * 128).view(2, 128))
    batch = SimpleNamespace(
        reqs=[SimpleNamespace(rid=f"r{i}") for i in range(bs)], seq_lens=torch.tensor(seq_lens),
        req_pool_indices=torch.arange(bs), req_to_token_pool=pool,
    )  # fmt: skip
    result = SimpleNamespace(
        accept_lens=torch.tensor(accept_lens), next_token_ids=torch.tensor(rows).flatten(),
        speculative_num_draft_tokens=n, new_seq_lens=torch.tensor(seq_lens) + torch.tensor(accept_lens),
        next_draft_input=SimpleNamespace(topk_p=None, topk_index=None),
    )  # fmt: skip
    return batch, result


def test_a_drafting_steps_extend_covers_only_what_its_chain_did_not_write(monkeypatch):
    # r0: 10 positions committed, root 100 at position 10; its chain fed 11, 12, 13 (drafting
    # 14 too); verify accepted 11, 12 and then the target said 99: positions 10..12 committed,
    # the bonus 99 next. The draft's KV holds 11 and 12 already (a draft forward wrote them at
    # positions 10 and 11, SGLang's standalone layout: position p holds token p + 1), so the
    # extend runs over position 12 alone, fed the bonus. r1's chain was rejected at once.
    history = [7] * 10
    histories = {"r0": history + [100, 11, 12, 99], "r1": history + [100, 55]}
    worker, calls = _extending_worker(monkeypatch, histories)
    worker._fed = [[11, 12, 13], [21, 22, 23]]
    batch, result = _verified([10, 10], [[11, 12, 99, 0, 0], [55, 0, 0, 0, 0]], [3, 1])
    worker.backlog.add(["r0", "r1"], [0, 0])
    worker.draft_extend(batch, result)
    ((ranges, tokens),) = calls
    assert ranges == [(12, 13), (10, 11)]
    assert tokens == [[12, 99], [100, 55]]  # t[start .. end]: the last is the new bonus token
    assert worker.backlog.reused_rows == 2 and worker.backlog.step_extends == 1 and worker.backlog.catch_ups == 0
    assert worker._topk_source == "extend" and worker._fed is None
    assert result.next_draft_input.topk_index.flatten().tolist() == [0, 1]
    req_to_token = batch.req_to_token_pool.req_to_token
    assert bool(worker.draft_kv.valid[req_to_token[0, 10:13]].all()) and bool(worker.draft_kv.valid[req_to_token[1, 10]])


def test_a_chain_accepted_whole_extends_its_last_draft_and_the_bonus(monkeypatch):
    # Four drafts, three forwards fed 11, 12, 13: all four accepted (14 was never fed), bonus 15.
    histories = {"r0": [7] * 10 + [100, 11, 12, 13, 14, 15]}
    worker, calls = _extending_worker(monkeypatch, histories)
    worker._fed = [[11, 12, 13]]
    batch, result = _verified([10], [[11, 12, 13, 14, 15]], [5])
    worker.draft_extend(batch, result)
    ((ranges, tokens),) = calls
    assert ranges == [(13, 15)] and tokens == [[13, 14, 15]]


def test_a_deferred_extend_leaves_only_the_unwritten_tokens_behind(monkeypatch):
    histories = {"r0": [7] * 10 + [100, 11, 12, 99]}
    worker, calls = _extending_worker(monkeypatch, histories)
    worker._fed = [[11, 12, 13]]
    worker._defer_extend = lambda batch, rids: True
    worker._stale_topk = lambda bs: ("stale", "stale")
    batch, result = _verified([10], [[11, 12, 99, 0, 0]], [3])
    worker.draft_extend(batch, result)
    assert calls == [] and worker.backlog.lag(["r0"]) == [1]  # the bonus token's position alone
    req_to_token = batch.req_to_token_pool.req_to_token
    flags = worker.draft_kv.valid[req_to_token[0, 10:13]].tolist()
    assert flags == [True, True, False]


def test_tokens_after_a_backlog_are_extended_whole(monkeypatch):
    # A plain step left r0 two positions behind: this step's tokens follow a gap, so the
    # chain's KV (if any) cannot be trusted to join up: the catch-up extends everything.
    histories = {"r0": [7] * 10 + [100, 11, 12, 99]}
    worker, calls = _extending_worker(monkeypatch, histories)
    worker.backlog.add(["r0"], [2])
    worker._fed = [[11, 12, 13]]
    batch, result = _verified([10], [[11, 12, 99, 0, 0]], [3])
    worker.draft_extend(batch, result)
    ((ranges, tokens),) = calls
    assert ranges == [(8, 13)] and worker.backlog.catch_ups == 1 and worker.backlog.reused_rows == 0


def test_a_drafting_step_is_priced_with_the_extend_it_runs():
    # The extend after a drafting step covers the bonus token (and the chain's last draft
    # when all are accepted): 2 rows a request at most, not the verify window.
    worker = _model_worker(AdaptiveConfig(buckets=((1, (0, 4)),), explore_share=0.0))
    worker.cost = CostModel(
        target=ForwardCost(probe_rows=(1, 64), probe_ms=(100.0, 100.0)),
        draft=ForwardCost(probe_rows=(1, 2, 10), probe_ms=(40.0, 40.0, 80.0)),
    )  # fmt: skip
    assert worker._modelled_step_ms(1, 5) == 100.0 + 3 * 40.0 + 40.0
    assert worker._modelled_step_ms(5, 5) == 100.0 + 3 * 55.0 + 80.0  # forwards of 5 rows, an extend of 10
    worker.__dict__["backlog"] = None  # SGLang's extend over the window: 5 rows at batch 1
    assert worker._modelled_step_ms(1, 5) == 100.0 + 3 * 40.0 + 55.0


def test_runner_ups_join_chains_where_rows_are_free_and_acceptance_learns_the_chain_alone():
    from sglang_specsot.speculative.model_draft import RunnerUps
    from sglang_specsot.speculative.policy.acceptance import FirstDraftCalibration
    from sglang_specsot.speculative.policy.chains import ChainStop

    worker = _model_worker(AdaptiveConfig(buckets=((1, (0, 1, 2, 3)),), explore_share=0.0))
    ups = RunnerUps()
    worker._draft_worker = SimpleNamespace(topk=1, variable_steps=True, max_steps=3, runner_ups=ups)
    worker.num_draft_tokens, worker.runner_up_counts = 6, {"steps": 0, "verified": 0, "accepted": 0}
    batch = _batch(2)
    # r0 drafted 1, 2, 3 (second choices 41 at depth 1, 42 and 43 from the two forwards);
    # r1's last extend put another token first: its first runner-up is unknown, so none.
    ups.first.update({"r0": (1, 41, 0.2), "r1": (9, 19, 0.3)})
    ups.by_forward.extend([[(42, 0.1), (52, 0.1)], [(43, 0.05), (53, 0.1)]])
    stop = ChainStop([0.8, 0.8], [0.9, 0.9], FirstDraftCalibration(), lambda depth: 100.0 + 40 * depth, 0.0)
    stop.observe([0.7, 0.7])
    stop.observe([0.6, 0.6])
    chain = DraftTree((7, 1, 2, 3), (-1, 0, 1, 2))
    other = DraftTree((8, 5, 6), (-1, 0, 1))
    seeds, sizes = worker._with_runner_ups(batch, [chain, other], [4, 3], stop.reach)
    # Rows are free (the target costs 100 ms at 1-64 rows), and the window holds 6 nodes:
    # r0's chain of 4 takes its two best runner-ups (depth 1's 0.2, then depth 2's).
    assert seeds[1] == other and sizes[1] == 3
    assert seeds[0].size == sizes[0] == 6 and set(seeds[0].tokens) == {7, 1, 2, 3, 41, 42}
    assert worker._priced_width(SimpleNamespace(speculative_num_draft_tokens=6)) == 4
    assert worker.runner_up_counts == {"steps": 1, "verified": 2, "accepted": 0}
    # Verify took r0's runner-up at depth 2 (1, 42, then the bonus): its chain was right once.
    assert worker._drafts_accepted(0, [1, 42]) == 1 and worker.runner_up_counts["accepted"] == 1
    assert worker._drafts_accepted(1, [5, 6]) == 2 and worker.runner_up_counts["accepted"] == 1
    # Nothing to add where the cost model prices every row: 1,000 ms a row more.
    worker.cost = CostModel(target=ForwardCost(probe_rows=(1, 64), probe_ms=(100.0, 64000.0)), draft=worker.cost.draft)
    worker._step_chains = worker._chain_width = None
    seeds, sizes = worker._with_runner_ups(batch, [chain, other], [4, 3], stop.reach)
    assert seeds == [chain, other] and sizes == [4, 3] and worker._step_chains is None
    # An exploring step (no ChainStop) reaches depths at the plan's estimates.
    worker._last_ps, worker._last_firsts = [0.5, 0.8], [0.9, 0.6]
    assert worker._planned_reach([chain, None]) == [pytest.approx([0.9, 0.45, 0.225]), []]
