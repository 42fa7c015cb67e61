"""The budget policy, with synthetic costs and acceptance: drafts only where they pay."""

from __future__ import annotations

import contextlib
import json

import pytest

from sglang_specsot.bench.ceiling import (
    measured_speedup_ceiling,
    parse_step_table,
    speedup_ceiling,
)
from sglang_specsot.costs.cost_model import CostModel, ForwardCost
from sglang_specsot.speculative.policy.acceptance import (
    AcceptanceStats,
    ChainAcceptance,
    DepthAcceptance,
    FirstDraftCalibration,
    expected_drafts_accepted,
    useful_budget,
)
from sglang_specsot.speculative.policy.chains import (
    ChainStop,
    pick_runner_ups,
    runner_up_gains,
)
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.planning import (
    StepPlan,
    best_plan,
    candidate_plans,
    drafting_near,
    explore_every,
    explore_plan,
    may_pay,
)

BUDGETS = tuple(range(8))


def plan_step(*args, **kwargs) -> StepPlan:
    """The best of the candidate plans, as the policy picks it."""
    return best_plan(candidate_plans(*args, **kwargs))


def _cpu_bf16() -> CostModel:
    """Flat to 32 rows (a bf16 matmul on this CPU), then linear; plus a fixed overhead."""
    return CostModel(ForwardCost(probe_rows=(1, 32, 64), probe_ms=(100.0, 100.0, 200.0), overhead_ms=20.0))


def _plan(ps, cost=None, budgets=BUDGETS, min_budget=0):
    cost = cost or _cpu_bf16()
    return plan_step(ps, budgets, lambda bs, w: cost.step_ms(bs, w), 0.05, min_budget)


def test_expected_drafts_accepted_is_a_truncated_geometric_sum():
    assert expected_drafts_accepted(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert expected_drafts_accepted(1.0, 4) == 4.0
    assert expected_drafts_accepted(0.0, 4) == 0.0


def test_useful_budget_stops_where_the_next_token_is_unlikely():
    assert useful_budget(0.5, 7, 0.05) == 4  # 0.5^4 = 0.0625, 0.5^5 < 0.05
    assert useful_budget(0.9, 3, 0.05) == 3
    assert useful_budget(0.01, 7, 0.05) == 0


def test_free_rows_at_batch_one_are_filled():
    plan = _plan([0.6])
    assert plan.width > 1 and plan.budgets[0] > 0


def test_nothing_pays_when_rows_cost_in_proportion():
    # Cost linear in rows from the first row on: every draft costs a full token's time.
    linear = CostModel(ForwardCost(probe_rows=(1, 2), probe_ms=(100.0, 200.0)))
    plan = _plan([0.6, 0.6, 0.6, 0.6], cost=linear)
    assert plan.width == 1 and plan.budgets == (0, 0, 0, 0)


def test_a_request_whose_drafts_do_not_pay_gets_none():
    plan = _plan([0.8, 0.01])
    assert plan.budgets[0] > 0 and plan.budgets[1] == 0


def test_wide_batches_draft_less_than_narrow_ones():
    narrow, wide = _plan([0.5] * 2), _plan([0.5] * 16)
    assert wide.width < narrow.width


def test_a_plain_step_when_acceptance_is_nil():
    plan = _plan([0.0] * 4)
    assert plan.width == 1 and plan.budgets == (0,) * 4
    assert plan.expected_tokens == 4.0


def test_never_worse_than_plain_by_the_model():
    cost = _cpu_bf16()
    for bs in (1, 2, 4, 8, 16, 32):
        for p in (0.0, 0.1, 0.3, 0.6, 0.9):
            plan = _plan([p] * bs, cost=cost)
            assert plan.rate >= bs / cost.step_ms(bs, 1) - 1e-12


def test_a_draft_model_chain_is_always_verified():
    plan = _plan([0.0, 0.0], min_budget=4)
    assert plan.budgets == (4, 4) and plan.width == 5


def test_acceptance_is_estimated_per_key_and_drifts_back_to_the_prior():
    stats = AcceptanceStats(AdaptiveConfig.default(7))
    assert stats.p("g") == stats.prior() == 0.5  # nothing seen yet: the configured prior
    for _ in range(50):
        stats.observe("g", budget=4, accepted=4)
    assert stats.p("g") > 0.95
    assert stats.p("new") > 0.9  # a new group starts where the server's drafts have been
    for _ in range(50):
        stats.observe("bad", budget=4, accepted=0)
    assert stats.p("bad") < 0.1
    assert stats.prior() < 0.1  # the server's recent drafts all failed
    for _ in range(200):  # no drafts: the counts decay, the estimate returns to the prior
        stats.observe("g", budget=0, accepted=0)
    assert stats.p("g") == pytest.approx(stats.prior(), abs=0.01)
    stats.forget("g")
    assert stats.p("g") == stats.prior()


def test_a_steps_verifies_decay_the_estimates_once():
    # Five branches of one group verify together: one bad step must not erase the twelve
    # good ones before it, in the group's estimate or in its role's (where idle groups drift).
    def run(stats, one_step: bool):
        for _ in range(12):
            with stats.one_step() if one_step else contextlib.nullcontext():
                for _ in range(5):
                    stats.observe("g", budget=1, accepted=1 if stats._probe.pop() else 0, role="branch")
        with stats.one_step() if one_step else contextlib.nullcontext():
            for accepted in (1, 1, 0, 0, 0):
                stats.observe("g", budget=1, accepted=accepted, role="branch")

    pattern = [True, True, False, True, True] * 12  # 0.8 accepted over the twelve steps
    stepped, per_verify = (AcceptanceStats(AdaptiveConfig.default(7)) for _ in range(2))
    for stats, one_step in ((stepped, True), (per_verify, False)):
        stats._probe = list(pattern)
        run(stats, one_step)
    assert stepped.p("g", "branch") > 0.7 and stepped.prior("branch") > 0.7
    # Decayed per verify instead, the one step's three misses, last, outweigh the twelve before.
    assert per_verify.p("g", "branch") < 0.62 and per_verify.prior("branch") < 0.62
    # Plain steps (one observation per request each) drift the group back to its role's rate.
    for _ in range(30):
        with stepped.one_step():
            for _ in range(5):
                stepped.observe("g", budget=0, accepted=0, role="branch")
    assert stepped.p("g", "branch") == pytest.approx(stepped.prior("branch"), abs=0.02)
    assert stepped.prior("branch") > 0.7


def test_outside_a_step_every_observation_decays():
    with_steps, without = (AcceptanceStats(AdaptiveConfig.default(7)) for _ in range(2))
    for accepted in (1, 0, 1, 1):
        with with_steps.one_step():
            with_steps.observe("g", budget=1, accepted=accepted)
        without.observe("g", budget=1, accepted=accepted)
    assert with_steps._counts["g"] == pytest.approx(without._counts["g"])


def test_the_prior_follows_the_servers_recent_drafts_only():
    stats = AcceptanceStats(AdaptiveConfig.default(7))
    stats.observe("a", budget=2, accepted=2)
    before = stats.prior()
    stats.observe("a", budget=0, accepted=0)  # a plain step is not evidence about drafts
    assert stats.prior() == before > 0.5


def test_a_new_group_starts_from_its_roles_recent_drafts():
    # A server answering SoT branches (their drafts mostly rejected) and normal answers
    # (mostly accepted): a new normal answer must not start from the branches' acceptance.
    stats = AcceptanceStats(AdaptiveConfig.default(7))
    for _ in range(30):
        stats.observe("sot-1", budget=2, accepted=0, role="branch")
    assert stats.prior("plain") == stats.prior() < 0.1  # no normal answer yet: the server's
    for _ in range(10):
        stats.observe("r1", budget=2, accepted=2, role="plain")
    assert stats.prior("plain") > 0.9 and stats.p("r2", "plain") > 0.9
    assert stats.prior("branch") < 0.1 and stats.p("sot-2", "branch") < 0.1
    assert stats.has_evidence("plain") and not stats.has_evidence("skeleton")
    assert stats.prior("skeleton") == stats.prior()  # mixes both, weighted by recency
    assert set(stats.priors()) == {"plain", "branch"}
    stats.observe("r1", budget=0, accepted=0, role="plain")  # a plain step: no evidence
    assert stats.priors()["plain"] > 0.9


def test_server_info_shows_each_group_against_its_own_roles_prior():
    # /server_info's acceptance_p must show what a group's plans read: a normal answer with
    # one verify behind it is near the normal answers' prior, not the server's (branches').
    stats = AcceptanceStats(AdaptiveConfig.default(7), max_keys=2)
    for _ in range(30):
        stats.observe("sot-1", budget=2, accepted=0, role="branch")
    for _ in range(10):
        stats.observe("r1", budget=2, accepted=2, role="plain")
    stats.observe("r2", budget=1, accepted=1, role="plain")
    shown = stats.info()
    assert shown["r2"] == round(stats.p("r2", "plain"), 3) > 0.9
    assert abs(shown["r2"] - stats.p("r2")) > 0.1  # against the server's prior it would differ
    assert set(shown) == {"r1", "r2"}  # max_keys: the oldest group went, with its role
    stats.observe("r3", budget=1, accepted=1)  # no role: the server's prior, as p(key)
    assert stats.info()["r3"] == round(stats.p("r3"), 3)
    stats.forget("r3")
    stats.forget_groups()
    assert stats.info() == {} and stats._role_of == {}


def _context_like(
    stats: ChainAcceptance | AcceptanceStats, key: str = "g", role: str | None = None, rounds: int = 60
) -> None:
    """Verifies of 3-token chains whose first draft is right one time in four and whose
    later drafts are right one time in two (as SoT-context drafts on unseen text)."""
    for _ in range(rounds):
        for accepted in (0, 0, 0, 1, 0, 0, 0, 2):  # first: 2 of 8; later: 1 right, 2 stops
            stats.observe(key, budget=3, accepted=accepted, role=role)


def test_a_chains_first_draft_and_its_later_ones_are_estimated_apart():
    stats = ChainAcceptance(AdaptiveConfig.default(7))
    assert stats.first("g") == stats.p("g") == 0.5  # nothing seen: the configured prior
    _context_like(stats)
    assert stats.first("g") == pytest.approx(0.25, abs=0.08)
    assert stats.p("g") == pytest.approx(1 / 3, abs=0.08)  # 1 right of 3 tried after a right one
    # One p for every depth fits 3 accepted drafts to 8 early stops: 0.27, above the first
    # draft's 0.25 and below the later ones' 0.33.
    one = AcceptanceStats(AdaptiveConfig.default(7))
    _context_like(one)
    assert stats.first("g") < one.p("g") < stats.p("g")


def test_a_first_draft_that_missed_says_nothing_of_the_later_ones():
    stats = ChainAcceptance(AdaptiveConfig.default(7))
    for _ in range(30):
        stats.observe("g", budget=4, accepted=4)
    before = stats.p("g")
    for _ in range(30):
        stats.observe("g", budget=4, accepted=0)
    assert stats.first("g") < 0.1 and stats.p("g") == before > 0.95
    for _ in range(30):  # a budget of one says nothing of later drafts either
        stats.observe("g", budget=1, accepted=1)
    assert stats.first("g") > 0.9 and stats.p("g") == before
    for _ in range(200):  # no drafts: both drift back to the server's priors
        stats.observe("g", budget=0, accepted=0)
    assert stats.p("g") == pytest.approx(stats._next.prior(), abs=0.01)
    assert stats.first("g") == pytest.approx(stats._first.prior(), abs=0.01)
    with pytest.raises(ValueError, match="accepted=3 outside"):
        stats.observe("g", budget=2, accepted=3)


def test_chain_acceptance_reports_and_forgets_per_group_and_role():
    stats = ChainAcceptance(AdaptiveConfig.default(7), max_keys=2)
    _context_like(stats, "r1", role="plain", rounds=10)
    stats.observe("r2", budget=1, accepted=1, role="plain")  # no later draft seen yet
    shown = stats.info()
    assert set(shown) == {"r1", "r2"} and set(shown["r2"]) == {"first", "p"}
    # r2 has no later-draft evidence: it reads its role's prior, as its plans do.
    assert shown["r2"]["p"] == round(stats.p("r2", "plain"), 3) == stats.priors()["plain"]["p"]
    assert stats.has_evidence("plain") and not stats.has_evidence("branch")
    stats.forget("r1")
    assert set(stats.info()) == {"r2"}
    stats.forget_groups()
    assert stats.info() == {} and set(stats.priors()) == {"plain"}


def test_the_plan_drafts_the_second_context_token_that_pays():
    # Rows nearly free (batch 1 on this CPU: 109 ms a step, 2.5 ms a row more): the first
    # draft right 0.26 of the time, a later one 0.5 given its parent. The second token
    # (0.13) is above min_token_prob and worth its row; one p fitted to the same verifies
    # (~0.28 and dipping below 0.22 with the text) cut the chain at one token.
    step_ms = lambda bs, w: 109.0 + 2.5 * (w - 1)  # noqa: E731
    split = plan_step([0.5], range(6), step_ms, 0.05, firsts=[0.26])
    assert split.budgets == (3,)  # 0.26, 0.13, 0.065; the 4th (0.03) is under min_token_prob
    assert plan_step([0.21], range(6), step_ms, 0.05).budgets == (1,)


def test_a_chain_calibrates_its_first_draft_towards_the_first_drafts_estimate():
    calibration = FirstDraftCalibration()  # uninformative: every probability is worth its prior
    step_ms = lambda depth: 200.0 + 20.0 * depth  # noqa: E731
    stop = ChainStop([0.8], [0.5], calibration, step_ms, 0.05, first_ps=[0.3])
    assert stop.reach == [[0.3]]
    stop.observe([0.5])
    assert stop.reach[0] == pytest.approx([0.3, 0.24])  # the later draft at p = 0.8
    assert ChainStop([0.8], [0.5], calibration, step_ms, 0.05).reach == [[0.8]]  # default: ps


def test_sglang_config_format_with_specsot_keys():
    text = json.dumps({
        "1": {"candidate_steps": [0, 3, 7], "up_hysteresis": 0.0},
        "8": {"candidate_steps": [0, 1]},
        "specsot": {"decay": 0.2, "min_token_prob": 0.1},
    })  # fmt: skip
    config = AdaptiveConfig.from_json(text, max_budget=7)
    assert config.candidates(1) == (0, 3, 7) and config.candidates(7) == (0, 3, 7)
    assert config.candidates(8) == config.candidates(40) == (0, 1)
    assert config.decay == 0.2 and config.min_token_prob == 0.1
    assert config.defer_draft_extend is True  # the default; false extends every step
    off = json.dumps({"1": {"candidate_steps": [0, 3]}, "specsot": {"defer_draft_extend": False}})
    assert AdaptiveConfig.from_json(off, max_budget=7).defer_draft_extend is False


@pytest.mark.parametrize(
    "data, message",
    [
        ({"1": {"candidate_steps": [0, 9]}}, "exceed 7"),
        ({"1": {"candidate_steps": []}}, "non-negative ints"),
        ({"specsot": {}}, "batch-size key"),
        ({"1": {"candidate_steps": [1]}, "specsot": {"decay": 0}}, "decay"),
        ({"1": {"candidate_steps": [1]}, "specsot": {"decya": 0.2}}, "takes keys"),
        ({"1": {"candidate_steps": [1]}, "specsot": [0.2]}, "takes keys"),
        ({"1": {"candidate_steps": [1]}, "specsot": {"defer_draft_extend": "no"}}, "true or false"),
        ({"1": {"candidate_steps": [1]}, "specsot": {"explore_share": 1.5}}, "explore_share"),
        ({"1": {"candidate_steps": [1]}, "specsot": {"explore_p": 1.0}}, "explore_p"),
        ({"1": {"candidate_steps": [1]}, "specsot": {"long_match": -1}}, "long_match"),
        ({"1": {"candidate_steps": [1]}, "specsot": {"long_match": 2.5}}, "long_match"),
        ({"1": {"candidate_steps": [1]}, "specsot": {"cold_verifies": -1}}, "cold_verifies"),
        ({"1": {"candidate_steps": [1]}, "specsot": {"cold_verifies": True}}, "cold_verifies"),
        ({"1": {"candidate_steps": [1]}, "specsot": {"runner_ups": 1}}, "runner_ups"),
    ],
)
def test_bad_configs_name_the_problem(data, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveConfig.from_json(json.dumps(data), max_budget=7)


def test_acceptance_keys_are_bounded_oldest_first():
    # One key per SoT group served: the estimate must not grow the server's memory forever.
    stats = AcceptanceStats(AdaptiveConfig.default(7), max_keys=3)
    for key in ("a", "b", "c"):
        stats.observe(key, budget=4, accepted=4)
    stats.observe("a", budget=4, accepted=4)  # "a" observed again: "b" is now the oldest
    stats.observe("d", budget=4, accepted=4)
    assert set(stats.info()) == {"a", "c", "d"}
    assert stats.p("b") == stats.prior()  # evicted: back to the prior


def test_exploring_costs_at_most_its_share_of_plain_time():
    # A plain step 100 ms, an exploring one 150 ms: 50 ms extra is 5% of 10 plain steps.
    assert explore_every(plain_ms=100.0, explore_ms=150.0, share=0.05) == 10
    assert explore_every(plain_ms=100.0, explore_ms=100.0, share=0.05) == 1  # free: every step
    assert explore_every(plain_ms=100.0, explore_ms=150.0, share=0.0) == 0  # never


def test_may_pay_needs_a_drafting_plan_beyond_the_margin():
    plain = StepPlan(width=1, budgets=(0,), expected_tokens=1.0, step_ms=100.0)
    draft = lambda tokens: StepPlan(width=2, budgets=(1,), expected_tokens=tokens, step_ms=100.0)  # noqa: E731
    assert may_pay([plain, draft(1.2)], margin=0.05)
    assert not may_pay([plain, draft(1.04)], margin=0.05)  # exploring may cost 5%: 4% more cannot repay it
    assert not may_pay([plain], margin=0.0)  # nothing drafts
    assert may_pay([draft(0.5)], margin=0.05)  # a fixed tree: no plain plan to beat


def test_an_exploring_step_drafts_the_smallest_positive_candidate():
    plan = explore_plan([0.2, 0.9], candidates=(0, 3, 5), step_ms=lambda bs, width: 10.0 * width)
    assert plan.budgets == (3, 3) and plan.width == 4 and plan.step_ms == 40.0
    assert plan.expected_tokens == pytest.approx(2 + expected_drafts_accepted(0.2, 3) + expected_drafts_accepted(0.9, 3))
    assert explore_plan([0.5], candidates=(0,), step_ms=lambda bs, width: 1.0).width == 1  # nothing to try


def test_depth_acceptance_counts_each_depth_given_its_parent():
    depth = DepthAcceptance()
    depth.observe(3, 3)  # all three accepted
    depth.observe(3, 1)  # depth 1 accepted, depth 2 reached and rejected, depth 3 never reached
    depth.observe(2, 0)  # depth 1 rejected
    info = depth.info()
    assert info["reached"] == [3, 2, 1] and info["accepted"] == [2, 1, 1]
    assert info["p_by_depth"] == [round(2 / 3, 3), 0.5, 1.0]


def test_depth_acceptance_rejects_more_accepted_than_drafted():
    with pytest.raises(ValueError, match="accepted=4 outside"):
        DepthAcceptance().observe(3, 4)


def test_a_known_first_draft_acceptance_scales_the_chain():
    assert expected_drafts_accepted(0.8, 3, first=0.5) == pytest.approx(0.5 + 0.4 + 0.32)
    assert expected_drafts_accepted(0.8, 0, first=0.5) == 0.0
    assert useful_budget(0.5, 7, 0.05, first=0.1) == 2  # 0.1, 0.05, then 0.025 < 0.05
    assert useful_budget(0.5, 7, 0.05, first=0.5) == useful_budget(0.5, 7, 0.05)


def _draft_model_cost() -> CostModel:
    # 1.5B target + 0.5B draft on this CPU, roughly: rows free, a draft forward 0.4x a target's.
    flat = (1, 64)
    return CostModel(ForwardCost(flat, (100.0, 100.0), overhead_ms=50.0), ForwardCost(flat, (40.0, 40.0), overhead_ms=25.0))


def test_an_unsure_draft_drafts_its_free_first_token_only_and_a_sure_one_its_chain():
    cost = _draft_model_cost()
    # A draft model's chain: budget b costs b - 1 draft forwards (the first token is read
    # from the last extend's top-k) and an extend; a plain step costs the target alone.
    step_ms = lambda bs, w: cost.step_ms(bs, w, draft_steps=max(0, w - 2), draft_extend=w > 1)  # noqa: E731
    sure = plan_step([0.8], range(5), step_ms, 0.05, firsts=[0.97])
    unsure = plan_step([0.8], range(5), step_ms, 0.05, firsts=[0.2])
    blind = plan_step([0.8], range(5), step_ms, 0.05)
    assert sure.budgets[0] >= 2 and blind.budgets[0] >= 2  # worth draft forwards
    assert unsure.budgets == (0,)  # behind an unlikely first token not even its extend is


def test_first_draft_calibration_learns_what_a_probability_is_worth():
    cal = FirstDraftCalibration(decay=0.01, prior_weight=4.0)
    assert cal.rate(0.99, prior=0.7) == pytest.approx(0.7)  # no evidence: the budget model's p
    for i in range(400):
        cal.observe(0.98, accepted=i % 20 != 0)  # sure: 95% accepted
        cal.observe(0.2, accepted=i % 5 == 0)  # unsure: 20% accepted
    assert cal.rate(0.99, prior=0.7) == pytest.approx(0.95, abs=0.01)
    assert cal.rate(0.1, prior=0.7) == pytest.approx(0.2, abs=0.02)
    assert cal.rate(0.6, prior=0.7) == pytest.approx(0.7)  # a bin never seen stays at the prior
    info = cal.info()
    assert info["edges"] == list(FirstDraftCalibration.EDGES) and info["accept_rate"][2] is None


def test_drafting_is_near_when_a_drafting_plan_comes_within_a_tenth_of_the_best():
    plain = StepPlan(1, (0,), 1.0, 100.0)
    assert drafting_near([plain, StepPlan(2, (1,), 1.3, 140.0)], plain)  # 0.93 of plain's rate
    assert not drafting_near([plain, StepPlan(2, (1,), 1.2, 140.0)], plain)  # 0.86
    assert not drafting_near([plain], plain)  # nothing drafts at all


def test_the_ceiling_is_the_best_budgets_gain_under_the_measured_costs():
    # A 2-core CPU's probe of the 1.5B target and the 0.5B draft (overheads left out).
    target = ForwardCost(probe_rows=(1, 4, 8, 16, 32), probe_ms=(195.6, 248.4, 317.0, 477.1, 775.1))
    draft = ForwardCost(probe_rows=(1, 4, 8, 16, 32), probe_ms=(73.2, 95.1, 113.6, 160.9, 258.1))
    with_draft = CostModel(target=target, draft=draft)
    # Batch 1, every draft accepted with 0.8: two drafts (verify 3 rows, one draft forward,
    # an extend of 3 rows) bring 2.44 tokens in 230.8 + 73.2 + 87.8 ms: 1.22x plain.
    gain, budget = speedup_ceiling(with_draft, 1, [0.8] * 4, draft_model=True)
    assert budget == 2 and gain == pytest.approx(2.44 * 195.6 / (230.8 + 73.2 + 87.8), rel=1e-3)
    # Batch 8 at the branches' measured 0.55: nothing beats plain.
    assert speedup_ceiling(with_draft, 8, [0.55] * 4, draft_model=True) == (1.0, 0)
    # Extending only what the chain did not write (the bonus, and the last draft when all b
    # are accepted: 1 + 0.8^b rows) instead of the window: still two drafts, at 1.25x.
    narrow, budget = speedup_ceiling(with_draft, 1, [0.8] * 4, draft_model=True, narrow_extend=True)
    extend = 73.2 + (95.1 - 73.2) * 0.64 / 3  # 1.64 rows, on the line from 1 to 4 rows
    assert budget == 2 and narrow > gain and narrow == pytest.approx(2.44 * 195.6 / (230.8 + 73.2 + extend), rel=1e-3)
    # Runner-ups in rows that are free (a flat target up to 8 rows): two drafts and their two
    # runner-ups, each right 0.2 of the time where the chain reached its parent (1, then
    # 0.8), add 0.36 tokens for nothing; on the measured costs (rows not free) a wider verify
    # pays less than that; without a window there is no room for them.
    flat = CostModel(target=ForwardCost(probe_rows=(1, 8, 16), probe_ms=(195.6, 195.6, 317.0)), draft=draft)
    chains, _ = speedup_ceiling(flat, 1, [0.8] * 2, draft_model=True, narrow_extend=True)
    ups, budget = speedup_ceiling(flat, 1, [0.8] * 2, draft_model=True, narrow_extend=True, runner_up_hit=0.2, max_width=8)
    assert budget == 2 and ups == pytest.approx(chains * (2.44 + 0.36) / 2.44, rel=1e-6)
    costly, _ = speedup_ceiling(with_draft, 1, [0.8] * 2, draft_model=True, narrow_extend=True, runner_up_hit=0.2, max_width=8)
    assert narrow < costly < narrow * (2.44 + 0.36) / 2.44
    assert speedup_ceiling(flat, 1, [0.8] * 2, True, True, runner_up_hit=0.2)[0] == chains  # no window, no room
    # Drafting from the context costs the verify rows alone: at batch 1 and p 0.8 the whole
    # 6 (7 rows: 248.4 + 3/4 of the way to 317.0 ms) bring 1 + 4 (1 - 0.8^6) tokens.
    gain, budget = speedup_ceiling(CostModel(target=target), 1, [0.8] * 6, draft_model=False)
    assert budget == 6 and gain == pytest.approx((1 + 4 * (1 - 0.8**6)) * 195.6 / (248.4 + 68.6 * 3 / 4), rel=1e-3)


def test_the_measured_steps_ceiling_prices_each_width_at_what_its_steps_cost():
    # A 1.5B + 0.5B server's measured steps at 4 branches: plain 285.7 ms, then
    # 476.8 / 607.8 / 709.4 ms for windows of 2-4 rows; acceptance 0.70 / 0.66 / 0.66.
    steps = parse_step_table({"4x1": 285.7, "4x2": 476.8, "4x3": 607.8, "4x4": 709.4, "1x1": 269.1, "1x4": 465.2})
    assert steps[4, 3] == 607.8 and steps[1, 4] == 465.2
    ps = [0.70, 0.66, 0.66]
    reach = [0.70, 0.70 * 0.66, 0.70 * 0.66 * 0.66]
    gain, width = measured_speedup_ceiling(steps, 4, ps)
    # A 2-row window brings 1.70 tokens for 1.67x the time; 3 rows 2.162 for 2.13x.
    rates = {w: (1 + sum(reach[: w - 1])) * 285.7 / steps[4, w] for w in (2, 3, 4)}
    assert width == max(rates, key=rates.get) and gain == pytest.approx(max(rates.values()))
    assert gain < 1.05
    # Widths never measured are skipped, not priced; no plain step of that batch, no answer.
    gain, width = measured_speedup_ceiling(steps, 1, ps)
    assert width == 4 and gain == pytest.approx((1 + sum(reach)) * 269.1 / 465.2)
    assert measured_speedup_ceiling(steps, 2, ps) is None
    # Where drafting never pays at these times, plain decoding is the ceiling.
    assert measured_speedup_ceiling({(1, 1): 100.0, (1, 2): 300.0}, 1, [0.9]) == (1.0, 1)


def test_a_measured_step_key_that_is_not_bs_x_width_is_refused():
    with pytest.raises(ValueError, match="'4by2' is not 'BSxW'"):
        parse_step_table({"4by2": 10.0})


def _sure_when_confident() -> FirstDraftCalibration:
    calibration = FirstDraftCalibration()
    for _ in range(200):  # a draft model that is right when sure and wrong when not
        calibration.observe(0.97, accepted=True)
        calibration.observe(0.2, accepted=False)
    return calibration


def test_a_chain_goes_on_while_the_draft_is_sure_and_stops_where_it_is_not():
    # A step drafting d tokens costs 200 + 100 d ms (a plain step 200): a draft token pays
    # when it is accepted more often than about 0.6 given the step's tokens so far.
    step_ms = lambda depth: 200.0 + 100.0 * depth  # noqa: E731
    stop = ChainStop([0.9], [0.97], _sure_when_confident(), step_ms, min_token_prob=0.05)
    for _ in range(3):
        assert stop.go_on()
        stop.observe([0.97])
    assert stop.depth == 4 and stop.depths() == [4]
    stop.observe([0.2])  # the draft turns unsure: its 5th token is as good as lost
    assert not stop.go_on() and stop.depths() == [4]  # and it is cut (reach under 0.05)


def test_a_chain_weighs_the_step_cost_against_the_tokens_it_expects():
    calibration = FirstDraftCalibration()  # uninformative: every probability is worth p
    # At p = 0.6 the second draft is reached 0.6 of the time and accepted 0.36: it costs a
    # third of the step (300 -> 400 ms) for a fifth more tokens (1.6 -> 1.96): stop.
    stop = ChainStop([0.6], [0.5], calibration, lambda depth: 200.0 + 100.0 * depth, 0.05)
    assert not stop.go_on()
    # Where a draft row costs a tenth of a step, it goes on.
    cheap = ChainStop([0.6], [0.5], calibration, lambda depth: 200.0 + 20.0 * depth, 0.05)
    assert cheap.go_on()


def test_a_chain_looks_past_a_token_that_does_not_pay_alone():
    # Steps of 1 / 2 / 3 / 4 drafts as measured at batch 1 (1.5B + 0.5B): the first draft
    # forward carries the chain's setup, so the second token costs more than the third.
    ms = {1: 388.0, 2: 520.0, 3: 579.0, 4: 745.0}
    calibration = FirstDraftCalibration()  # uninformative: the first draft at first_ps, later ones at p
    myopic = ChainStop([0.8], [0.5], calibration, ms.__getitem__, 0.05, first_ps=[0.7])
    assert not myopic.go_on()  # 2.26 tokens in 520 ms < 1.7 in 388
    ahead = ChainStop([0.8], [0.5], calibration, ms.__getitem__, 0.05, first_ps=[0.7], max_depth=4)
    assert ahead.go_on()  # 2.71 tokens in 579 ms > 1.7 in 388
    ahead.observe([0.5])
    assert ahead.go_on()  # at depth 2 the third token pays on its own
    ahead.observe([0.5])
    assert not ahead.go_on()  # 3.07 tokens in 745 ms < 2.71 in 579
    assert ahead.depths() == [3]
    # Where the first draft is unlikely, nothing deeper pays either.
    unsure = ChainStop([0.8], [0.5], calibration, ms.__getitem__, 0.05, first_ps=[0.2], max_depth=4)
    assert not unsure.go_on()


def test_requests_that_draft_nothing_do_not_count_in_the_chain():
    calibration = _sure_when_confident()
    alone = ChainStop([0.9], [0.2], calibration, lambda depth: 200.0 + 100.0 * depth, 0.05)
    batch = ChainStop([0.9, 0.9], [0.2, None], calibration, lambda depth: 200.0 + 100.0 * depth, 0.05)
    assert not alone.go_on() and not batch.go_on()
    batch.observe([0.97, 0.97])
    assert batch.qs == [[0.2, 0.97], []] and batch.depths() == [1, 0]


def test_drafting_runs_are_measured_by_the_batch_size_they_began_at():
    from sglang_specsot.speculative.policy.runs import DraftingRuns

    runs = DraftingRuns(window=3, min_runs=2)

    def run(bs: int, n: int, exploring: bool = False) -> None:
        for i in range(n):
            runs.step(bs if i == 0 else bs - 1, drafted=True, exploring=exploring and i == 0)
        runs.step(bs, drafted=False)

    run(5, 2)
    assert runs.expected(5) is None  # one run is not enough
    run(5, 4)  # a request finished mid-run: still a run begun at 5
    assert runs.expected(5) == 3.0 and runs.expected(4) is None
    run(5, 9, exploring=True)  # begun by exploring: says nothing of how long drafting pays
    assert runs.expected(5) == 3.0
    run(5, 6), run(5, 8)  # the window keeps the last 3: 4, 6, 8
    assert runs.expected(5) == 6.0 and runs.info() == {"5": {"steps": 6.0, "saved_ms": 0.0, "fresh_for": 500}}
    runs.step(1, drafted=False)  # plain steps alone are no run
    assert runs.expected(1) is None


def test_drafting_runs_measure_what_they_saved_setup_and_flushes_included():
    from sglang_specsot.speculative.policy.runs import DraftingRuns

    runs = DraftingRuns(window=3, min_runs=2)
    runs.step(4, drafted=False, saved_ms=-150.0)  # a plain step that flushed: owed by the next run
    runs.step(4, drafted=False)  # a plain step that deferred its extend: nothing
    for saved in (-400.0, 60.0, 60.0):  # a catch-up step, then two steps that gained
        runs.step(4, drafted=True, saved_ms=saved)
    runs.step(4, drafted=False)
    assert runs.pays(4) is None  # one run is not a verdict
    for saved in (-300.0, 50.0):
        runs.step(4, drafted=True, saved_ms=saved)
    runs.step(4, drafted=False)
    assert runs.pays(4) is False  # -430 and -250 ms: these runs cost more than they saved
    assert runs.info()["4"] == {"steps": 2.5, "saved_ms": -340.0, "fresh_for": 500}
    for _ in range(2):  # two runs that repay their catch-ups bring the mean of the last 3 above 0
        runs.step(4, drafted=True, saved_ms=-100.0)
        runs.step(4, drafted=True, saved_ms=400.0)
        runs.step(4, drafted=False)
    assert runs.pays(4) is True  # -250, +300, +300
    runs.step(3, drafted=True, exploring=True, saved_ms=-900.0)  # exploring: not a verdict
    runs.step(3, drafted=False)
    assert runs.pays(3) is None and runs.expected(3) is None
    assert runs.totals() == {  # but every run is counted in the server's life: -430, -250, +300, +300
        "4": {"runs": 4, "saved_ms": -80.0, "exploring_runs": 0, "exploring_saved_ms": 0.0},
        "3": {"runs": 0, "saved_ms": 0.0, "exploring_runs": 1, "exploring_saved_ms": -900.0},
    }


def test_a_batch_sizes_runs_are_forgotten_once_stale():
    from sglang_specsot.speculative.policy.runs import DraftingRuns

    runs = DraftingRuns(window=3, min_runs=2, fresh_steps=10)
    for _ in range(2):
        runs.step(5, drafted=True, saved_ms=-200.0)
        runs.step(5, drafted=False)
    assert runs.pays(5) is False and runs.expected(5) == 1.0
    for _ in range(10):  # the last run ended 10 steps ago: still fresh
        runs.step(2, drafted=False)
    assert runs.pays(5) is False
    runs.step(2, drafted=False)  # 11: measured again from scratch
    assert runs.pays(5) is None and runs.expected(5) is None and runs.info() == {}


def test_a_run_that_ends_after_its_keys_verdict_went_stale_starts_a_new_window():
    # A run that began with no query (nothing to repay) must not extend a stale window: its
    # verdict would outlive fresh_steps, and a losing one would never count as lost.
    from sglang_specsot.speculative.policy.runs import DraftingRuns

    runs = DraftingRuns(window=3, min_runs=2, fresh_steps=10)
    for _ in range(2):
        runs.step(5, drafted=True, saved_ms=-200.0)
        runs.step(5, drafted=False)
    for _ in range(11):  # stale now, but nothing asked
        runs.step(1, drafted=False)
    runs.step(5, drafted=True, saved_ms=-100.0)
    runs.step(5, drafted=False)
    assert runs.expected(5) is None  # one fresh run, not three
    runs.step(5, drafted=True, saved_ms=-100.0)
    runs.step(5, drafted=False)
    assert runs.pays(5) is False and runs.info()["5"]["fresh_for"] == 20  # the stale loss counted


def test_a_verdict_that_keeps_losing_is_measured_again_less_often():
    # Each re-measurement costs min_runs runs behind catch-ups; where it only confirms that a
    # batch loses, a long-lived server would pay that every fresh_steps for ever.
    from sglang_specsot.speculative.policy.runs import DraftingRuns

    runs = DraftingRuns(window=3, min_runs=2, fresh_steps=10, max_backoff=2)

    def measure(saved_ms: float) -> None:
        for _ in range(2):
            runs.step(5, drafted=True, saved_ms=saved_ms)
            runs.step(5, drafted=False)

    def fresh_for() -> int:  # plain steps at another key until 5's verdict is gone (one past its last fresh step)
        n = 0
        while runs.pays(5) is not None:
            runs.step(1, drafted=False)
            n += 1
        return n

    measure(-200.0)
    assert runs.info()["5"]["fresh_for"] == 10
    assert fresh_for() == 11  # a first losing verdict: fresh_steps, it may be a cold start's
    measure(-200.0)
    assert runs.info()["5"]["fresh_for"] == 20
    assert fresh_for() == 21  # lost again: twice as long
    measure(-150.0)
    assert fresh_for() == 41
    measure(-150.0)
    assert fresh_for() == 41  # capped at 2 ** max_backoff
    measure(300.0)
    assert runs.pays(5) is True and fresh_for() == 11  # it pays now: measured again as often
    measure(-200.0)
    assert fresh_for() == 11  # a loss after a paying verdict starts over
    for _ in range(2):  # untimed runs (all 0) are no verdict: they never back off
        measure(0.0)
        assert runs.expected(5) == 1.0 and runs.info()["5"]["fresh_for"] == 10
        for _ in range(11):
            runs.step(1, drafted=False)
        assert runs.expected(5) is None


def test_exploring_is_funded_by_a_share_of_what_drafting_saved():
    from sglang_specsot.speculative.policy.runs import ExploreFund

    fund = ExploreFund(share=0.1)
    assert fund.allows()  # a server explores once before it has earned anything
    fund.charge(-300.0)  # an exploring step's catch-up and verify: 300 ms more than plain
    assert not fund.allows()
    fund.earn(2000.0)  # drafting runs saved 2 s: 200 ms of it may go to exploring
    assert not fund.allows() and fund.balance_ms == -100.0
    fund.earn(-500.0)  # a flush that readied a run: it costs exploring's share too
    fund.charge(250.0)  # the run an exploring step began paid: exploring earned it back whole
    assert fund.allows() and fund.info() == {"balance_ms": 100.0, "unfunded": 0}


def test_a_run_begun_by_exploring_is_known_while_it_lasts():
    from sglang_specsot.speculative.policy.runs import DraftingRuns

    runs = DraftingRuns()
    runs.step(2, drafted=True, exploring=True)
    assert runs.exploring_run
    runs.step(2, drafted=True)  # its next step drafts by the plan, in the run exploring began
    assert runs.exploring_run
    runs.step(2, drafted=False)
    assert not runs.exploring_run
    runs.step(2, drafted=True)  # a run the plan began
    assert not runs.exploring_run


def test_runs_without_measured_savings_give_no_verdict():
    from sglang_specsot.speculative.policy.runs import DraftingRuns

    runs = DraftingRuns(window=3, min_runs=2)
    for _ in range(3):  # a worker that does not time its steps (a GPU under overlap) passes 0
        runs.step(4, drafted=True)
        runs.step(4, drafted=False)
    assert runs.pays(4) is None and runs.expected(4) == 1.0


def test_verifies_count_the_drafted_steps_behind_each_roles_estimate():
    stats = ChainAcceptance(AdaptiveConfig.default(4))
    stats.observe("g", 2, 1, "branch")
    stats.observe("g", 0, 0, "branch")  # a plain step: no evidence
    stats.observe("r", 3, 3, "plain")
    stats.observe("r", 1, 0, None)
    assert (stats.verifies("branch"), stats.verifies("plain"), stats.verifies("skeleton")) == (1, 1, 0)
    assert stats.verifies() == 3  # the server's: every drafted verify, of any role or none


def test_a_runner_up_is_worth_its_probability_where_verify_reaches_it():
    # Depth 1 is always reached; depth 3 only where drafts 1 and 2 were accepted.
    assert runner_up_gains([0.8, 0.6, 0.3], [0.1, 0.2, 0.5]) == pytest.approx([0.1, 0.16, 0.3])
    assert runner_up_gains([0.8], []) == []


def test_runner_ups_fill_free_rows_best_first_and_stay_out_of_costly_ones():
    gains = [[0.1, 0.16, 0.3, 0.01]]  # a chain of 4 drafts: 5 nodes
    free = lambda width: 100.0  # noqa: E731 - a verify costs the same for any width here
    # Free rows: every runner-up with a gain that fits an 8-wide window, best first.
    assert pick_runner_ups(gains, [5], 8, free, step_ms=200.0, tokens=3.0) == [[1, 2, 3]]
    assert pick_runner_ups(gains, [5], 10, free, step_ms=200.0, tokens=3.0) == [[1, 2, 3, 4]]
    # 15 ms a row, at 3 tokens in 200 ms: the best runner-up (0.3) pays for its row, the
    # next (0.16) does not pay for another.
    costly = lambda width: 100.0 + 15.0 * width  # noqa: E731
    assert pick_runner_ups(gains, [5], 8, costly, step_ms=200.0, tokens=3.0) == [[3]]
    # Dearer still: none. No gain: none, however free.
    assert pick_runner_ups(gains, [5], 8, lambda w: 100.0 + 60.0 * w, step_ms=200.0, tokens=3.0) == [[]]
    assert pick_runner_ups([[0.0, 0.0]], [3], 8, free, step_ms=200.0, tokens=3.0) == [[]]
    # Under `min_gain` (the worker's min_token_prob) a runner-up is left out, free or not.
    assert pick_runner_ups(gains, [5], 10, free, step_ms=200.0, tokens=3.0, min_gain=0.12) == [[2, 3]]


def test_runner_ups_of_a_batch_are_weighed_by_the_width_every_request_is_verified_at():
    # The window is the widest tree's: a request with a shorter chain takes more runner-ups
    # at the same width; a request that drafts nothing takes none.
    gains, sizes = [[0.2, 0.1, 0.05], [0.3], []], [4, 2, 1]
    picks = pick_runner_ups(gains, sizes, 6, lambda width: 100.0, step_ms=300.0, tokens=5.0)
    assert picks == [[1, 2], [1], []]
