"""A draft model's deferred draft-extend (`DeferredExtend`): which rows its extend covers after
a drafting step, when plain steps leave it to a backlog, and what a drafting plan must repay
before it may catch up."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang_specsot.costs.cost_model import ForwardCost
from sglang_specsot.sot.tag import SoTTag
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.drafters.model import ModelProposal
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.planning import best_plan
from tests.unit.speculative.builders import (
    batch,
    cost,
    decide,
    decision,
    decoding,
    draft_model,
    model_drafting,
    model_worker,
    verified_step,
    warm,
)

ONE_DRAFT = AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0)


# -- the deferred draft-extend: its rows ----------------------------------------------------------


def _extending_drafter(histories: dict[str, list[int]], defer: bool = False):
    """A drafter whose draft-extend runs for real up to the draft model: the histories are
    given, and the draft model's ragged extend records what it was asked (its top-k: the
    request's index)."""
    calls = []

    def extend_ranges(batch, ranges, tokens):
        calls.append((ranges, tokens))
        n = len(ranges)
        return torch.ones(n, 1), torch.arange(n).view(n, 1)

    config = AdaptiveConfig(buckets=((1, (0, 4)),), explore_share=0.0)
    drafter = model_drafting(config, draft_model(4, extend_ranges=extend_ranges))
    deferred = drafter.deferred
    deferred.history = lambda req: histories[req.rid]
    deferred.shared = lambda batch, pass_sizes: [[0] * len(batch.reqs) for _ in pass_sizes]
    deferred._defer = lambda batch, rids, policy, view, pricing: defer
    return drafter, calls


def _extend(drafter, step, result, fed) -> bool:
    """The drafter's draft-extend after a step whose chains' forwards fed `fed`."""
    trees = tuple(DraftTree((0,), (-1,)) for _ in step.reqs)
    return drafter.draft_extend(step, result, ModelProposal(trees, "extend", decision(step), fed=fed), None)


def test_a_drafting_steps_extend_covers_only_what_its_chain_did_not_write():
    # r0: 10 positions committed, root 100 at position 10; its chain fed 11, 12, 13 (drafting
    # 14 too); verify accepted 11, 12 and then the target said 99: positions 10..12 committed,
    # the bonus 99 next. The draft's KV holds 11 and 12 already (a draft forward wrote them at
    # positions 10 and 11, SGLang's standalone layout: position p holds token p + 1), so the
    # extend runs over position 12 alone, fed the bonus. r1's chain was rejected at once.
    history = [7] * 10
    drafter, calls = _extending_drafter({"r0": history + [100, 11, 12, 99], "r1": history + [100, 55]})
    backlog = drafter.deferred.backlog
    step, result = verified_step([10, 10], [[11, 12, 99, 0, 0], [55, 0, 0, 0, 0]], [3, 1])
    backlog.add(["r0", "r1"], [0, 0])
    assert _extend(drafter, step, result, ([11, 12, 13], [21, 22, 23]))
    ((ranges, tokens),) = calls
    assert ranges == [(12, 13), (10, 11)]
    assert tokens == [[12, 99], [100, 55]]  # t[start .. end]: the last is the new bonus token
    assert backlog.reused_rows == 2 and backlog.step_extends == 1 and backlog.catch_ups == 0
    assert drafter.topk_source == "extend"
    assert result.next_draft_input.topk_index.flatten().tolist() == [0, 1]
    req_to_token, valid = step.req_to_token_pool.req_to_token, drafter.deferred.draft_kv.valid
    assert bool(valid[req_to_token[0, 10:13]].all()) and bool(valid[req_to_token[1, 10]])


def test_a_chain_accepted_whole_extends_its_last_draft_and_the_bonus():
    # Four drafts, three forwards fed 11, 12, 13: all four accepted (14 was never fed), bonus 15.
    drafter, calls = _extending_drafter({"r0": [7] * 10 + [100, 11, 12, 13, 14, 15]})
    step, result = verified_step([10], [[11, 12, 13, 14, 15]], [5])
    _extend(drafter, step, result, ([11, 12, 13],))
    ((ranges, tokens),) = calls
    assert ranges == [(13, 15)] and tokens == [[13, 14, 15]]


def test_a_deferred_extend_leaves_only_the_unwritten_tokens_behind():
    drafter, calls = _extending_drafter({"r0": [7] * 10 + [100, 11, 12, 99]}, defer=True)
    step, result = verified_step([10], [[11, 12, 99, 0, 0]], [3])
    assert not _extend(drafter, step, result, ([11, 12, 13],))  # deferred: no extend ran
    assert calls == [] and drafter.deferred.backlog.lag(["r0"]) == [1]  # the bonus token's position alone
    flags = drafter.deferred.draft_kv.valid[step.req_to_token_pool.req_to_token[0, 10:13]].tolist()
    assert flags == [True, True, False]


def test_tokens_after_a_backlog_are_extended_whole():
    # A plain step left r0 two positions behind: this step's tokens follow a gap, so the
    # chain's KV (if any) cannot be trusted to join up: the catch-up extends everything.
    drafter, calls = _extending_drafter({"r0": [7] * 10 + [100, 11, 12, 99]})
    backlog = drafter.deferred.backlog
    backlog.add(["r0"], [2])
    step, result = verified_step([10], [[11, 12, 99, 0, 0]], [3])
    _extend(drafter, step, result, ([11, 12, 13],))
    ((ranges, tokens),) = calls
    assert ranges == [(8, 13)] and backlog.catch_ups == 1 and backlog.reused_rows == 0
    assert drafter.topk_source == "catch_up"


# -- the deferred draft-extend: when it waits -------------------------------------------------------


def _accepting(worker, p: float) -> None:
    """Every request's acceptance estimates (first and later drafts) at `p`."""
    worker.policy.acceptance = worker.policy.first_acceptance = lambda view: [p] * view.bs


def _deferred_steps(worker, p: float, limit: int = 1000) -> int:
    """Plain steps of one request whose extends the drafter defers before it flushes."""
    _accepting(worker, p)
    step, deferred, n = batch(1), worker.drafter.deferred, 0
    view = worker.requests.view(step.reqs)
    while n < limit:
        deferred.backlog.add(["r0"], [1])
        if not deferred._defer(step, ["r0"], worker.policy, view, worker.drafter.pricing(step)):
            return n
        n += 1
    return n


def test_while_drafting_is_far_from_paying_the_backlog_is_not_flushed_for_latency():
    # A plain step costs 100 ms, a one-draft step 140 (its extend): at p=0.3 a draft step's
    # 1.3 tokens per 140 ms is within NEAR_PAYING of plain's 1 per 100, at p=0.01 it is not.
    # Near: flushed once a catch-up would cost more than a plain step and an extend (140 ms;
    # passes of 64 rows, where a draft forward costs least per row, 40 ms each): at 193
    # tokens behind, four passes.
    assert _deferred_steps(model_worker(ONE_DRAFT), 0.3) == 191
    # Far: nothing flushes it (a backlog costs no memory; drafting again must repay it).
    assert _deferred_steps(model_worker(ONE_DRAFT), 0.01) == 1000


def test_no_flush_readies_a_run_that_the_measured_runs_say_would_not_pay():
    assert _deferred_steps(model_worker(ONE_DRAFT), 0.3) == 191  # near paying: flushed to keep the catch-up short
    losing = model_worker(ONE_DRAFT)
    for _ in range(3):
        losing.policy.drafting_runs.step("1 plain", drafted=True, saved_ms=-100.0)
        losing.policy.drafting_runs.step("1 plain", drafted=False)
    assert _deferred_steps(losing, 0.3) == 1000


# -- what a drafting plan must repay -------------------------------------------------------------


def test_exploring_counts_the_catch_up_it_needs_against_its_share():
    def plain_steps_per_explore(worker) -> int:
        step, ps = batch(1), [0.01]
        view, pricing = worker.requests.view(step.reqs), worker.drafter.pricing(step)
        for n in range(1, 100):
            plan, _ = worker.policy._maybe_explore(view, pricing, ps, best_plan(worker.policy.plans(ps, None)))
            if plan.width > 1:
                return n
        raise AssertionError("never explored")

    config = AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.25)
    current = model_worker(config)
    warm(current.policy)  # not a cold server: exploring on schedule
    # An exploring step costs 40 ms more than a plain one: 40 / (0.25 x 100) -> every 2nd.
    assert plain_steps_per_explore(current) == 2
    behind = model_worker(config)
    warm(behind.policy)
    behind.drafter.deferred.backlog.add(["r0"], [80])
    # Its catch-up over 80 tokens costs 80 ms more (passes of 64 and 16 rows, 40 ms each;
    # one pass of 80 would cost 200): 120 / 25 -> every 5th.
    assert plain_steps_per_explore(behind) == 5
    # A server that has never verified a draft explores at its first plain step, catch-up or not.
    cold = model_worker(config)
    cold.drafter.deferred.backlog.add(["r0"], [80])
    assert plain_steps_per_explore(cold) == 1


def _width_behind(worker, rid: str = "r0", max_new_tokens: int = 100, behind: int = 320) -> int:
    """The first step's width for request `rid`, `behind` tokens behind (a catch-up of 320
    costs 200 ms: five passes of 64 rows), 5 tokens written of its `max_new_tokens`."""
    worker.drafter.deferred.backlog.add([rid], [behind])
    return max(decide(worker, SimpleNamespace(reqs=decoding([rid], max_new_tokens))).sizes)


def _runs(worker, key: str, saved_by_run) -> None:
    """Earlier drafting runs at `key`, each a list of its steps' savings, each followed by a
    plain step."""
    for run in saved_by_run:
        for saved in run:
            worker.policy.drafting_runs.step(key, drafted=True, saved_ms=saved)
        worker.policy.drafting_runs.step(key, drafted=False)


def test_a_drafting_plan_must_repay_the_catch_up_it_needs_in_the_steps_left():
    def first_width(max_new_tokens: int) -> int:
        worker = model_worker(ONE_DRAFT)
        _accepting(worker, 0.9)
        width = _width_behind(worker, max_new_tokens=max_new_tokens)
        assert worker.policy.unrepaid == int(width == 1)  # reported as drafting_not_repaid
        assert worker.policy.report()["drafting_not_repaid"] == worker.policy.unrepaid
        return width

    # One draft at p = 0.9: 1.9 tokens in 140 ms where plain takes 190 ms, 50 ms saved a step.
    assert first_width(max_new_tokens=100) == 2  # 95 tokens left, 50 steps: 2.5 s saved > 200 ms
    assert first_width(max_new_tokens=10) == 1  # 5 tokens left, 2.6 steps: 130 ms saved < 200 ms


def test_the_catch_up_must_be_repaid_within_the_drafting_runs_measured_at_this_batch_size():
    def first_width(runs: list[int], runs_at: str = "1 plain") -> int:
        worker = model_worker(ONE_DRAFT)
        _accepting(worker, 0.9)
        _runs(worker, runs_at, [[10.0] * n for n in runs])  # earlier runs of n drafting steps that paid
        return _width_behind(worker)

    # 50 ms saved a step (above), 50 steps left: drafts while runs here last 5 steps or more.
    assert first_width([]) == 2  # no runs measured: the steps left are the horizon
    assert first_width([5, 6, 7]) == 2  # 6 steps x 50 ms = 300 ms > 200 ms
    assert first_width([2, 3, 4]) == 1  # 3 steps x 50 ms = 150 ms < 200 ms: stays plain
    assert first_width([2, 3, 4], runs_at="5 plain") == 2  # runs of another batch size say nothing
    assert first_width([2, 3, 4], runs_at="1 skeleton") == 2  # nor runs of skeletons


def test_a_catch_up_is_priced_at_what_catch_ups_have_really_cost():
    def first_width(real_ms: float, priced_ms: float) -> int:
        worker = model_worker(ONE_DRAFT)
        _accepting(worker, 0.9)
        # Runs of ~6 drafting steps, 50 ms saved each: 300 ms repays.
        _runs(worker, "1 plain", [[10.0] * n for n in (5, 6, 7)])
        worker.drafter.deferred.backlog.count_catch_up(rows=400, ms=real_ms, priced_ms=priced_ms)
        return _width_behind(worker)  # priced by the model at 200 ms

    assert first_width(real_ms=4000.0, priced_ms=4000.0) == 2  # priced right: 200 ms < 300 ms
    # Catch-ups took twice their price ((9000 + 1000) / (4000 + 1000)): this one 400 ms > 300 ms.
    assert first_width(real_ms=9000.0, priced_ms=4000.0) == 1


def test_no_catch_up_where_the_runs_begun_at_this_batch_size_cost_more_than_they_saved():
    def first_width(saved_by_run: list[float], runs_at: str = "1 plain") -> int:
        worker = model_worker(ONE_DRAFT)
        _accepting(worker, 0.9)
        # Earlier runs of 6 drafting steps (long enough to repay, by the plan).
        _runs(worker, runs_at, [[saved] + [0.0] * 5 for saved in saved_by_run])
        return _width_behind(worker)

    assert first_width([]) == 2  # nothing measured: the plan's 300 ms saved > 200 ms decides
    assert first_width([50.0, -20.0, 10.0]) == 2  # the runs here saved 13 ms each on average
    assert first_width([-150.0, -20.0, 10.0]) == 1  # they cost 53 ms each: stays plain
    assert first_width([-150.0, -20.0, 10.0], runs_at="5 plain") == 2  # runs of another batch size say nothing
    # Without a setup to repay, the plan alone decides, as when nothing is measured (the runs'
    # verdict includes setups).
    worker = model_worker(ONE_DRAFT)
    _accepting(worker, 0.9)
    _runs(worker, "1 plain", [[-500.0]] * 3)
    plan = best_plan(worker.policy.plans([0.9], None))
    step = batch(1)
    view = worker.requests.view(step.reqs)
    assert plan.width == 2 and worker.policy.setup_repaid(view, plan, worker.drafter.pricing(step))  # the backlog is empty


def test_skeletons_runs_and_normal_answers_runs_are_judged_apart():
    # At batch 1 a SoT skeleton (a short plan behind a long prompt) and a normal answer (a
    # long text) save differently from drafting: the verdict of one says nothing of the other.
    worker = model_worker(ONE_DRAFT)
    _accepting(worker, 0.9)
    worker.requests.tags["s0"] = SoTTag(group="g", role="skeleton")
    _runs(worker, "1 skeleton", [[-300.0]] * 3)  # skeletons' runs cost more than they saved, catch-ups included
    assert _width_behind(worker, "r0") == 2  # a normal answer drafts: the plan's 2.5 s saved > 200 ms
    assert _width_behind(worker, "s0") == 1  # a skeleton stays plain
    worker.requests.tags["b0"] = SoTTag(group="g", role="branch", point=0, n=2)
    reqs = decoding(["s0", "r0", "r1"])
    assert worker.requests.view(reqs).runs_key == "3 plain+skeleton" and worker.requests.view(reqs[1:]).runs_key == "2 plain"
    assert worker.requests.view(decoding(["b0"])).runs_key == "1 branch"


def test_a_batch_without_a_verdict_of_its_own_takes_a_smaller_batchs_losing_one():
    # A draft gains less the more rows a plain step fills: runs that lost at 2 requests
    # would lose at 3. Only a losing verdict passes up, only from smaller batches of the
    # same roles, and a batch's own verdict, once it has one, decides.
    def worker_with(runs: dict[str, float]):
        worker = model_worker(ONE_DRAFT)
        _accepting(worker, 0.9)
        for key, saved in runs.items():  # three runs at `key`, each saving `saved` ms
            _runs(worker, key, [[saved]] * 3)
        for i in range(4):
            worker.requests.tags[f"b{i}"] = SoTTag(group="g", role="branch", point=i, n=4)
        return worker

    def lose(runs: dict[str, float], n: int = 3) -> bool:
        worker = worker_with(runs)
        return worker.policy.runs_lose(worker.requests.view(decoding([f"b{i}" for i in range(n)])))

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
        worker.drafter.deferred._extend_writes_first = False  # no prefix shared in the catch-up: 160 rows
        worker.drafter.deferred.backlog.add(["r0", "r1"], [80, 80])
        return max(decide(worker, SimpleNamespace(reqs=decoding(["r0", "r1"], max_new_tokens=100))).sizes)

    assert first_width(50.0) == 2 and first_width(-100.0) == 1


def test_a_plain_step_taken_to_measure_plain_defers_its_extend():
    # Near paying (p=0.3), plain steps flush the backlog at 193 tokens (the test above). A step
    # the policy turns plain to measure a plain step defers whatever the backlog, as plans
    # price a plain step; once measured, the flushing resumes.
    worker = model_worker(ONE_DRAFT)
    policy = worker.policy
    policy.timed = True  # steps are timed here, and no plain step is measured yet
    assert policy.measures_plain(1)
    assert _deferred_steps(worker, 0.3) == 1000
    measured = model_worker(ONE_DRAFT)
    measured.policy.timed = True
    for _ in range(4):  # the first, cold, is not counted
        measured.policy.measured.observe(1, 1, 100.0)  # the plain step's price, as the model's
    assert not measured.policy.measures_plain(1)
    assert _deferred_steps(measured, 0.3) == 191


# -- the catch-up's passes ------------------------------------------------------------------------

# The 0.5B draft's probe on an AVX2 CPU without native bf16: int8 products to 16 rows, bf16 beyond.
AVX2_DRAFT = ((1, 4, 8, 16, 32, 64), (19.3, 20.1, 26.3, 41.7, 764.7, 1520.0))


def _drafter_costing(draft_curve, histories=None):
    costs = cost((1, 64), (100.0, 100.0))
    costs.draft = ForwardCost(probe_rows=draft_curve[0], probe_ms=draft_curve[1])
    calls = []

    def extend_ranges(batch, ranges, tokens):
        calls.append(ranges)
        n = len(ranges)
        return torch.ones(n, 1), torch.arange(n).view(n, 1)

    drafter = model_drafting(ONE_DRAFT, draft_model(4, extend_ranges=extend_ranges), costs)
    if histories is not None:
        drafter.deferred.history = lambda req: histories[req.rid]
    drafter.deferred._defer = lambda batch, rids, policy, view, pricing: False
    return drafter, calls


def test_a_catch_up_runs_in_passes_of_the_rows_a_draft_forward_costs_least_per_row_at():
    # r0 is 45 positions behind, then a step commits 3 more: 48 rows. One pass of 48 costs
    # 1,142 ms on this curve, three passes of 16 rows 125 ms.
    drafter, calls = _drafter_costing(AVX2_DRAFT, {"r0": [7] * 50 + [100, 11, 12, 99]})
    deferred = drafter.deferred
    step, result = verified_step([50], [[11, 12, 99, 0, 0]], [3])
    deferred.backlog.add(["r0"], [45])
    # Priced before the step as it will run: passes of 16, 16 and 13 rows.
    assert abs(deferred.setup_ms(step) - (2 * 41.7 + deferred.cost.draft.ms(13))) < 1e-6
    _extend(drafter, step, result, ([11, 12, 13],))
    assert calls == [[(5, 21)], [(21, 37)], [(37, 53)]]
    assert deferred.backlog.catch_ups == 3 and deferred.backlog.catch_up_rows_total == 48
    # Rows ever cheaper per row: one pass, as before.
    drafter, calls = _drafter_costing(((1, 16, 64), (10.0, 11.0, 14.0)), {"r0": [7] * 50 + [100, 11, 12, 99]})
    drafter.deferred.backlog.add(["r0"], [45])
    _extend(drafter, step, result, ([11, 12, 13],))
    assert calls == [[(5, 53)]]


def test_branches_sharing_a_prompt_catch_up_in_one_wide_pass_where_that_is_cheaper():
    # Four SoT branches, 301 positions behind each, the first 300 in the slots they share
    # through the radix cache. One pass extends the prefix once: 304 rows. Passes of 16
    # cannot share it (a request attends only to KV written in its own pass or before):
    # 1,204 rows.
    def shape(draft_curve):
        drafter, _ = _drafter_costing(draft_curve)
        deferred = drafter.deferred
        deferred.history = lambda req: [7] * 302
        deferred._extend_writes_first = True  # the draft's backend writes a pass's KV before it attends
        req_to_token = torch.arange(4 * 512).view(4, 512)
        req_to_token[:, :300] = req_to_token[0, :300]
        step = SimpleNamespace(
            reqs=decoding([f"r{i}" for i in range(4)]), req_pool_indices=torch.arange(4),
            req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        )  # fmt: skip
        deferred.backlog.add([f"r{i}" for i in range(4)], [301] * 4)
        return deferred.catch_up_shape(step)

    # 16 rows cost a little less per row than 64: the shared prefix outweighs it.
    wide = shape(((1, 16, 64), (10.0, 16.0, 80.0)))
    assert wide.pass_rows == 4096 and wide.shared == [0, 300, 300, 300]
    # Rows past 16 cost 18 times as much (AVX2 above): 1,204 rows in passes of 16 are cheaper.
    narrow = shape(AVX2_DRAFT)
    assert narrow.pass_rows == 16 and narrow.shared == [0, 0, 0, 0]
