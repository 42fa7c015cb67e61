"""The budget policy (`StepPolicy`) with the SoT context's costs: plain steps while drafts do
not pay, now and then a step that drafts so the acceptance estimates can learn again
(exploring, `explore_share`), and what a step's time and tokens teach it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from sglang_specsot.sot.tag import SoTTag
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.drafters import Proposal
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.step_policy import MEASURE_PLAIN_TRIES, PLAIN_FRESH_STEPS
from sglang_specsot.speculative.policy.values import StepOutcome, Verified
from tests.unit.speculative.builders import (
    batch,
    context_worker,
    cost,
    decide,
    decision,
    model_worker,
    set_target,
    warm,
)

# A group without evidence is at p = 0.1: drafts do not pay at its estimate, but would at
# explore_p (0.8), so a batch explores.
LOW_PRIOR = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25, prior_accepts=0.1, prior_misses=0.9)


def _widths(worker, step, n: int) -> list[int]:
    return [max(decide(worker, step).sizes) for _ in range(n)]


def test_a_batch_that_stopped_drafting_explores_within_its_time_share():
    worker, step = context_worker(LOW_PRIOR, shadows=False), batch(2)
    policy = worker.policy
    warm(policy)  # the server has verified drafts before (not cold)
    set_target(worker.cost, (1, 2), (100.0, 120.0))  # 20 ms a row more
    widths = _widths(worker, step, 24)
    # A plain step of 2 rows costs 120 ms, an exploring one (2 drafts, 3 rows per request)
    # 200 ms, 80 ms more: at a 25% share, one step in 3 explores (2 plain steps take 240 ms
    # and 80 ms is a third of it, more than a quarter: so every third step, 3 x 30 ms >= 80).
    assert widths == ([1] * 2 + [3]) * 8
    assert policy.explored == widths.count(3) and policy.hopeless == 0
    assert policy.report()["exploring_steps"] == policy.explored


def test_a_server_that_never_verified_a_draft_explores_at_once():
    # The same batch on a cold server: its estimate is the blind prior, so the first plain
    # step explores instead of waiting for the schedule (every third step).
    worker, step = context_worker(LOW_PRIOR, cost((1, 2), (100.0, 120.0)), shadows=False), batch(2)
    policy = worker.policy
    first = decide(worker, step)
    assert first.sizes == [3, 3] and first.exploring and policy.explored == 1
    policy.stats.observe("r0", 2, 0, "plain")  # verify saw both drafts miss
    policy.stats.observe("r1", 2, 0, "plain")
    # One step is no verdict: it stays cold until cold_verifies (4) drafted verifies.
    assert policy.stats.verifies("plain") == 2 < LOW_PRIOR.cold_verifies
    assert decide(worker, step).sizes == [3, 3] and policy.explored == 2
    policy.stats.observe("r0", 2, 0, "plain")
    policy.stats.observe("r1", 2, 0, "plain")
    assert _widths(worker, step, 6) == [1, 1, 3] * 2  # on schedule now


def test_a_fresh_server_whose_first_drafts_missed_learns_before_it_gives_up():
    # A fresh server's first step drafted from a low-confidence token and missed, and
    # exploring once has spent the fund: without cold_verifies it would draft nothing more for
    # hundreds of steps, planning from a first-draft estimate built on one miss.
    config = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25)
    worker, step = context_worker(config, cost((1, 2), (100.0, 120.0)), shadows=False), batch(1)
    policy = worker.policy
    policy.stats.observe("r0", 2, 0, "plain")
    policy.explore_fund.charge(-200.0)
    cold = decide(worker, step)
    assert cold.sizes == [3] and cold.exploring  # cold: funded or not
    assert policy.explore_fund.unfunded == 0
    policy.stats.observe("r0", 2, 2, "plain")  # what exploring finds: the drafts accept
    learned = decide(worker, step)
    assert max(learned.sizes) > 1 and not learned.exploring  # the plan drafts now
    # With cold_verifies=1, that first miss is the verdict: the fund spent, nothing explored.
    worker = context_worker(dataclasses.replace(config, cold_verifies=1), cost((1, 2), (100.0, 120.0)), shadows=False)
    worker.policy.stats.observe("r0", 2, 0, "plain")
    worker.policy.explore_fund.charge(-200.0)
    assert set(_widths(worker, step, 50)) == {1}


def test_no_exploring_where_drafting_could_not_pay_even_at_explore_p():
    # Rows cost in proportion (a verify of w rows costs w plain steps): no acceptance below
    # 1 makes a draft pay, so what exploring would learn could never change a plan.
    config = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25)
    worker, step = context_worker(config, shadows=False), batch(2)
    policy = worker.policy
    assert set(_widths(worker, step, 24)) == {1}
    # Exploring was due every 8th step (400 ms extra against a 25% share of 200 ms steps).
    # The server is cold throughout (it never drafts), yet only those turns count as skipped.
    assert policy.explored == 0 and policy.hopeless == 3
    assert policy.report()["exploring_skipped"] == 3
    # Where rows cost a fifth of a plain step, 2 drafts at p = 0.8 bring 2.44 tokens per
    # request in 200 ms against plain's 1 in 120: 1.46x, more than the 25% exploring costs.
    set_target(worker.cost, (1, 2), (100.0, 120.0))
    assert policy._worth_exploring(2)
    policy.config = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25, explore_p=0.3)
    assert not policy._worth_exploring(2)  # 1.3 tokens per 200 ms: 0.78x
    policy.config = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25, explore_p=None)
    assert policy._worth_exploring(2)  # null: on schedule, whatever the costs say


def test_acceptance_by_depth_is_split_by_where_the_chain_started():
    worker = context_worker(AdaptiveConfig(buckets=((1, (0, 2, 4)),)))
    chain = DraftTree((7, 8, 9, 10), (-1, 0, 1, 2))  # root + a chain of 3 drafts
    step = SimpleNamespace(reqs=[SimpleNamespace(rid="a"), SimpleNamespace(rid="b")])
    # a: all 3 drafts and the bonus; b: none
    result = SimpleNamespace(accept_lens=torch.tensor([4, 1]), next_token_ids=torch.tensor([8, 9, 10, 5, 3, 0, 0, 0]),
                             speculative_num_draft_tokens=4)  # fmt: skip
    worker.draft_extend(step, result, Proposal((chain, chain), "catch_up", decision(step)))
    step = SimpleNamespace(reqs=[SimpleNamespace(rid="a")])
    result = SimpleNamespace(accept_lens=torch.tensor([2]), next_token_ids=torch.tensor([8, 4, 0, 0]),
                             speculative_num_draft_tokens=4)  # fmt: skip
    worker.draft_extend(step, result, Proposal((chain,), "extend", decision(step)))
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
    config = AdaptiveConfig(buckets=((1, (0, 1, 2, 3, 4, 5)),), decay=0.01)
    worker, step = context_worker(config, cost((1, 2), (109.0, 111.5))), batch(1)
    policy, view = worker.policy, worker.requests.view(step.reqs)
    for _ in range(40):
        for accepted in (0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 2):
            policy.learn(view, Verified((3,), (accepted,), "context"))
    assert policy.stats.first("r0") == pytest.approx(0.25, abs=0.02)
    assert policy.stats.p("r0") == pytest.approx(4 / 7, abs=0.02)
    planned = decide(worker, step)
    assert planned.sizes == [4] and planned.plan.budgets == (3,)
    assert planned.firsts == (policy.stats.first("r0"),) and planned.ps == (policy.stats.p("r0"),)


def test_no_exploring_when_its_share_is_zero():
    worker = context_worker(AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.0), shadows=False)
    assert set(_widths(worker, batch(2), 30)) == {1}


def test_a_drafting_step_resets_the_count():
    worker, step = context_worker(AdaptiveConfig(buckets=((1, (0, 2)),), explore_share=0.25), shadows=False), batch(1)
    _widths(worker, step, 5)
    set_target(worker.cost, (1, 64), (100.0, 100.0))  # rows now free
    assert max(decide(worker, step).sizes) == 3 and worker.policy._plain_steps == 0


def test_measured_step_times_override_the_model_where_it_prices_a_width_wrong():
    worker = context_worker(AdaptiveConfig(buckets=((1, (0, 7)),), explore_share=0.0), cost((1, 64), (100.0, 100.0)))
    policy, step = worker.policy, batch(4)  # rows "free" by the model
    width = max(decide(worker, step).sizes)
    assert width == 5  # by the model a wide window is free (p = 0.5: 4 drafts are worth it)
    for _ in range(4):  # ... but such steps really take 4x a plain one (a shape's first step is not counted)
        policy.measured.observe(4, width, 400.0)
    assert policy.step_ms(4, width) == 400.0 and policy.step_ms(4, 1) == 100.0  # the rest: the model
    assert max(decide(worker, step).sizes) == 1
    assert worker.speculative_state_report()["specsot"]["measured_step_ms"] == {"4x5": 400.0}


def test_an_unmeasured_width_pays_what_a_narrower_step_cost_beyond_its_model():
    # Rows cost in proportion (100 ms a row, nothing learned beyond the probe); plain steps
    # measured at 140 ms: 40 ms each step pays that the model does not see.
    config = AdaptiveConfig(buckets=((1, (0, 1, 3)),), explore_share=0.0)
    policy = context_worker(config, cost((1, 8), (100.0, 800.0))).policy
    modelled = policy.costs.modelled_ms
    assert policy.step_ms(1, 2) == modelled(1, 2)  # nothing measured: the model
    for _ in range(4):  # the first of a shape is not counted
        policy.measured.observe(1, 1, 140.0)
    assert policy.step_ms(1, 1) == 140.0
    assert policy.step_ms(1, 2) == pytest.approx(modelled(1, 2) + 40.0)
    assert policy.step_ms(1, 4) == pytest.approx(modelled(1, 4) + 40.0)
    for _ in range(4):  # a measured width 2 is its own price, and the nearest for width 4
        policy.measured.observe(1, 2, 260.0)
    assert policy.step_ms(1, 2) == 260.0 and policy.step_ms(1, 4) == pytest.approx(modelled(1, 4) + 60.0)
    assert policy.step_ms(2, 2) == modelled(2, 2)  # another batch size: nothing measured there
    # A narrower step the model prices dearer than it ran lowers no price: unmeasured widths
    # keep the model's.
    cheap = context_worker(config, cost((1, 8), (100.0, 800.0))).policy
    for _ in range(4):  # the first of a shape is not counted
        cheap.measured.observe(1, 1, 80.0)
    assert cheap.step_ms(1, 2) == cheap.costs.modelled_ms(1, 2)


def test_a_context_step_is_priced_no_dearer_than_a_wider_one_measured():
    # A width measured in a slow stretch (139 ms) where a window 4 rows wider took 131: a
    # SoT-context step adds verify rows only, so the narrower one is priced at most 131,
    # and the policy may choose it again. The model's prices are bounded alike.
    config = AdaptiveConfig(buckets=((1, (0, 1, 5)),), explore_share=0.0)
    policy = context_worker(config, cost((1, 64), (140.0, 200.0))).policy
    for _ in range(4):  # the first of a shape is not counted
        policy.measured.observe(1, 2, 139.0)
        policy.measured.observe(1, 6, 131.0)
    assert policy.measured.ms(1, 2) == 139.0 and policy.step_ms(1, 2) == 131.0
    assert policy.step_ms(1, 1) == 131.0  # the model's 140 ms for one row, bounded too
    assert policy.step_ms(1, 6) == 131.0 and policy.step_ms(1, 4) == 131.0
    assert policy.step_ms(2, 1) == policy.costs.modelled_ms(2, 1)  # nothing wider measured at 2
    # With a draft model a step's width does not say what ran: no bound.
    chain = model_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0)).policy
    for _ in range(4):  # the first of a shape is not counted
        chain.measured.observe(1, 2, 139.0)
        chain.measured.observe(1, 6, 131.0)
    assert chain.step_ms(1, 2) == 139.0


def test_a_plain_step_that_flushed_is_not_what_a_plain_step_costs():
    worker = model_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
    step = batch(1)
    telemetry, backlog = worker.telemetry, worker.drafter.deferred.backlog

    def measured(width: int, extended: bool, catch_ups_before: int = 0) -> bool:
        """Whether the policy keeps this step's time as what a step of its width costs."""
        clock = telemetry.start(catch_ups_before)
        for stage in ("draft", "verify", "draft_extend"):
            clock.mark(stage)
        trees = (DraftTree(tuple(range(width)), tuple(range(-1, width - 1))),)
        proposal = Proposal(trees, "extend", decision(step))
        (outcome,) = telemetry.finish(clock, proposal, width, Verified((width - 1,), (0,), "extend", committed=1),
                                      extended, worker.drafter, [1])  # fmt: skip
        before = worker.policy.measured.steps
        worker.policy.observe(outcome)
        return worker.policy.measured.steps > before

    telemetry.timed = True
    assert not measured(width=1, extended=True)  # a flush: the plan prices plain steps as deferring
    assert measured(width=2, extended=True)  # a drafting step extends as its price says
    assert measured(width=1, extended=False)  # a plain step that deferred
    backlog.catch_ups = 1
    assert not measured(width=2, extended=True)  # a catch-up ran: owed whatever the step
    telemetry.timed = False
    assert not measured(width=1, extended=False, catch_ups_before=1)  # wall-clock means nothing here (a GPU)


def test_a_steps_saving_against_plain_decoding():
    worker = model_worker(AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0))
    step = batch(2)

    def saved(ms: float, drafted: bool, extended: bool) -> float:
        outcome = StepOutcome(
            decision=decision(step), ms=ms, committed=5,
            priced_width=2 if drafted else 1, drafted=drafted, extended_on_plain_step=extended, timed=True,
            caught_up=False,
        )  # fmt: skip
        return worker.policy._saved_ms(outcome)

    # A plain step of 2 requests costs 100 ms: 50 ms a token.
    assert saved(180.0, drafted=True, extended=True) == 5 * 50.0 - 180.0  # 70 ms saved
    assert saved(130.0, drafted=False, extended=False) == 0.0  # a plain step that deferred: plain decoding
    assert saved(130.0, drafted=False, extended=True) == -30.0  # it flushed: 30 ms more than plain
    assert saved(90.0, drafted=False, extended=True) == 0.0  # faster than the estimate: no credit


def test_exploring_waits_while_it_has_spent_more_than_drafting_saved():
    # As in the first test: p = 0.1, drafting pays only at explore_p; one step in 3 explores.
    worker, step = context_worker(LOW_PRIOR, cost((1, 2), (100.0, 120.0)), shadows=False), batch(2)
    policy = worker.policy
    warm(policy)
    policy.explore_fund.charge(-80.0)  # an exploring step that cost 80 ms more than plain decoding
    widths = _widths(worker, step, 9)
    # Every plain step waited, and the schedule did not advance meanwhile.
    assert widths == [1] * 9 and policy.explored == 0 and policy.explore_fund.unfunded == 9
    assert policy._plain_steps == 0
    policy.explore_fund.earn(400.0)  # drafting saved 400 ms: a quarter of it, 100 ms, is exploring's
    assert _widths(worker, step, 3) == [1, 1, 3] and policy.explored == 1
    assert worker.speculative_state_report()["specsot"]["explore_fund"] == {"balance_ms": 20.0, "unfunded": 9}


def test_a_role_little_drafted_for_explores_funded_or_not():
    # The server has drafted only for SoT branches, lost doing so (the fund is spent), and
    # learned they accept nothing. A normal answer (untagged: plain) starts from the server's
    # acceptance, where drafting does not pay: without exploring once it would never learn
    # its own (a normal answer accepts more of a draft model's drafts than branches do).
    config = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25)
    worker, step = context_worker(config, cost((1, 2), (100.0, 120.0)), shadows=False), batch(2)
    policy = worker.policy
    worker.requests.tags["b0"] = SoTTag(group="g", role="branch", point=0, n=2)
    for _ in range(20):
        policy.stats.observe("g", 2, 0, "branch")
    policy.explore_fund.charge(-500.0)
    assert decide(worker, step).sizes == [3, 3] and policy.explored == 1  # cold for its role
    assert policy.explore_fund.unfunded == 0
    warm(policy, key="r0")  # what it learned: its drafts missed too
    assert _widths(worker, step, 3) == [1, 1, 1]  # now it waits
    assert policy.explore_fund.unfunded == 3
    branches = SimpleNamespace(reqs=[SimpleNamespace(rid="b0")])
    assert max(decide(worker, branches).sizes) == 1  # the branches' role is known: no exploring


def test_exploring_on_schedule_whatever_the_costs_is_not_funded_either():
    config = AdaptiveConfig(buckets=((1, (0, 2, 4)),), explore_share=0.25, explore_p=None)
    worker, step = context_worker(config, cost((1, 2), (100.0, 120.0)), shadows=False), batch(2)
    warm(worker.policy)
    worker.policy.explore_fund.charge(-1000.0)
    assert _widths(worker, step, 3) == [1, 1, 3] and worker.policy.explore_fund.unfunded == 0


# -- the plain step, measured before drafting is weighed against it --------------------------


def _timed(policy, step, width: int, ms: float, caught_up: bool = False) -> None:
    """One timed step of `width` (1: a plain step that deferred its extend) observed."""
    outcome = StepOutcome(
        decision=decision(step), ms=ms, committed=len(step.reqs), priced_width=width, drafted=width > 1,
        extended_on_plain_step=False, timed=True, caught_up=caught_up,
    )  # fmt: skip
    policy.observe(outcome)


def _overpriced_plain_worker():
    # A probe run while another process took the cores: one row at 800 ms, two at 900. By it a
    # one-draft step costs 900 ms against 800 for plain, so drafting pays at any acceptance.
    config = AdaptiveConfig(buckets=((1, (0, 1)),), explore_share=0.0)
    worker = context_worker(config, cost((1, 2), (800.0, 900.0)))
    policy = worker.policy
    policy.acceptance = policy.first_acceptance = lambda view: [0.9] * view.bs  # drafts are accepted
    return worker, batch(1)


def test_a_plain_step_priced_by_the_probe_alone_is_measured_before_drafting_is_chosen():
    worker, step = _overpriced_plain_worker()
    policy = worker.policy
    assert max(decide(worker, step).sizes) == 2  # nothing timed yet (a GPU): the model decides
    _timed(policy, step, 2, 250.0)  # a drafting step really took 250 ms
    for ms in (400.0, 130.0, 130.0, 130.0):  # then plain steps, until three have measured one
        assert max(decide(worker, step).sizes) == 1 and policy.measures_plain(1)
        _timed(policy, step, 1, ms)  # the first, cold (kernels built for its shape), is not counted
    assert not policy.measures_plain(1) and policy.measured.ms(1, 1) == 130.0
    # Plain at 130 ms a token against a drafting step's 2 tokens at most: the model's 900 ms,
    # the one drafting step measured (250 ms) being one sample, not yet its price.
    assert max(decide(worker, step).sizes) == 1
    assert policy.report()["plain_measuring_steps"] == 4


def test_a_plain_step_that_cannot_be_measured_stops_being_forced():
    worker, step = _overpriced_plain_worker()
    policy = worker.policy
    _timed(policy, step, 2, 250.0)
    widths = []
    for _ in range(MEASURE_PLAIN_TRIES + 2):
        widths.append(max(decide(worker, step).sizes))
        _timed(policy, step, 1, 130.0, caught_up=True)  # a catch-up ran: no plain step's time
    assert widths == [1] * MEASURE_PLAIN_TRIES + [2, 2]
    assert policy.plain_measuring == MEASURE_PLAIN_TRIES


def test_a_plain_step_is_measured_again_every_hundred_steps_and_unpriced_once_stale():
    worker, step = _overpriced_plain_worker()
    policy = worker.policy
    _timed(policy, step, 2, 250.0)
    for _ in range(4):
        decide(worker, step)
        _timed(policy, step, 1, 130.0)
    assert not policy.measures_plain(1)
    for _ in range(PLAIN_FRESH_STEPS):  # drafting steps, chosen over the measured plain step
        _timed(policy, step, 2, 250.0)
    # Its price stands, but it is measured again: the first times may have been cold ones.
    assert policy.measured.ms(1, 1) == 130.0 and policy.measures_plain(1)
    for _ in range(3):
        decide(worker, step)
        _timed(policy, step, 1, 100.0)
    assert not policy.measures_plain(1) and policy.measured.ms(1, 1) == 100.0  # 3 of 6 times at 100
    for _ in range(policy.measured.fresh_steps + 1):
        _timed(policy, step, 2, 250.0)
    assert policy.measured.ms(1, 1) is None and policy.measures_plain(1)  # stale: unpriced, measured again
