"""The latency model that routes SoT by measured row cost and load (sot/latency.py)."""

from __future__ import annotations

import pytest

from sglang_specsot.sot import SoTConfig
from sglang_specsot.sot.budget import EXPECTED_ANSWER_TOKENS, HALF_SENTENCE_TOKENS, POINT_AIM_TOKENS
from sglang_specsot.sot.latency import (
    MARGIN,
    PRIOR_SKELETON_TOKENS,
    AnswerShape,
    LengthBook,
    RowCosts,
    ServerLoad,
    decide,
    unpriced,
)

# The 1.5B's start-up probe on an AMD EPYC with AVX2 and no native bf16: linear in rows
# (docs/benchmarks.md, "Where SoT loses").
EPYC_AVX2 = RowCosts((1, 4, 8), (197.0, 677.0, 1355.0), source="EPYC-AVX2 probe")
# The 1.5B's probe and learned overhead on the Xeon of the 16-question run, as its SPECSOT
# server reported them at stop (benchmarks/e2e-holdout1-sot-*/b035232/server_state.jsonl).
XEON = RowCosts(
    (1, 4, 8, 16, 32, 64), (173.997, 173.997, 176.785, 178.527, 193.927, 284.971), 133.863, source="Xeon probe"
)
# That run's plain answers (completion tokens) and SoT-server's speed-up on each of the 16
# held-out questions, 384-token cap (b035232/report.json).
HELD_OUT = [
    (311, 2.61), (57, 0.38), (107, 0.87), (368, 2.89), (279, 2.30), (76, 0.67), (221, 1.68), (357, 3.14),
    (384, 3.19), (70, 0.56), (372, 2.92), (384, 3.02), (331, 2.39), (323, 2.43), (375, 2.81), (287, 2.46),
]  # fmt: skip
# Qwen2.5's tokenizer on router_holdout questions: the normal prompt, the skeleton prompt, and
# the branches' shared prompt under a 5-point skeleton.
PROMPTS = {"prompt_tokens": 39, "skeleton_prompt_tokens": 186, "branch_prompt_tokens": 158}
CAP = 384


def held_out_shape(normal_tokens: int, prompts: dict = PROMPTS) -> AnswerShape:
    """A held-out SoT answer at the run's cap: the priced skeleton and 5 branches in budget."""
    prior = LengthBook().shape(SoTConfig(), CAP, **prompts)
    return AnswerShape(normal_tokens, prior.skeleton_tokens, prior.branch_tokens, prior.max_running, **prompts)


@pytest.mark.parametrize("prompts", [PROMPTS, {}], ids=["prompts-priced", "prompts-unknown"])
@pytest.mark.parametrize("load", [ServerLoad(), ServerLoad(1, 0), ServerLoad(3, 0), ServerLoad(0, 2, 8)], ids=str)
def test_on_a_linear_curve_sot_never_pays(prompts, load):
    for normal_tokens, _ in HELD_OUT:
        decision = decide(EPYC_AVX2, load, held_out_shape(normal_tokens, prompts))
        assert not decision.use_sot, decision.reason
        assert decision.ratio > 1 - MARGIN


def test_on_cheap_rows_the_model_picks_what_was_measured_faster():
    """Idle, the Xeon's curve sends every question whose SoT answer ran faster to SoT and the
    four with short normal answers (57-107 tokens, SoT 0.38-0.87x) to the normal answer."""
    for normal_tokens, speedup in HELD_OUT:
        decision = decide(XEON, ServerLoad(), held_out_shape(normal_tokens))
        assert decision.use_sot == (speedup > 1), (normal_tokens, speedup, decision.reason)
    long_answer = decide(XEON, ServerLoad(), held_out_shape(317))
    assert long_answer.use_sot and long_answer.sot_ms < long_answer.normal_ms / 2
    assert long_answer.branches_at_once == 5 and long_answer.curve == "Xeon probe"


def test_sot_steps_aside_as_the_running_batch_grows_and_comes_back_as_it_drains():
    """Priced as a policy (every request alike), not by the larger share of each forward that
    one request's branches would take from the others."""
    shape = held_out_shape(317)
    choices = [decide(XEON, ServerLoad(running), shape).use_sot for running in range(0, 65)]
    assert choices[0] and not choices[-1]
    first_normal = choices.index(False)
    assert not any(choices[first_normal:]), "once the batch is too busy, a busier one is too"
    ratios = [decide(XEON, ServerLoad(running), shape).ratio for running in range(0, 65, 8)]
    assert ratios == sorted(ratios)


def test_a_queue_counts_as_rows_and_a_full_batch_leaves_no_room_for_branches():
    shape = held_out_shape(317)
    assert decide(XEON, ServerLoad(0, 40), shape).use_sot == decide(XEON, ServerLoad(40, 0), shape).use_sot is False
    full = decide(XEON, ServerLoad(7, 1, max_running=8), shape)
    assert full.branches_at_once == 1 and not full.use_sot, full.reason
    roomy = decide(XEON, ServerLoad(1, 0, max_running=16), shape)
    assert roomy.branches_at_once == 5 and roomy.use_sot


def test_decisions_are_deterministic_and_carry_their_numbers():
    shape, load = held_out_shape(311), ServerLoad(2, 1, 32)
    first, again = decide(XEON, load, shape), decide(XEON, load, shape)
    assert first == again and first.info() == again.info()
    info = first.info()
    assert {"normal_ms", "sot_ms", "ratio", "margin", "running", "waiting", "shared", "branches_at_once", "shape",
            "curve", "reason"} <= set(info)  # fmt: skip
    assert (info["running"], info["waiting"], info["shared"]) == (2, 1, 3)
    assert "against" in first.reason and "2 running, 1 waiting" in first.reason
    assert info["shape"]["branch_tokens"] == list(shape.branch_tokens)
    assert info["row_costs"] == XEON.info() and info["row_costs"]["ms"][0] == 173.997


def test_where_no_curve_is_known_the_router_choice_stands():
    decision = unpriced(ServerLoad(1, 0), "the start-up probe has not reported yet")
    assert decision.use_sot and decision.curve == "unknown" and decision.sot_ms is None
    assert "probe has not reported" in decision.info()["reason"] and "ratio" not in decision.info()


def test_the_curve_interpolates_and_extends_its_last_slope():
    costs = RowCosts((1, 4, 8), (10.0, 10.0, 30.0), overhead_ms=5.0)
    assert costs.step_ms(0) == costs.step_ms(1) == 15.0
    assert costs.step_ms(6) == 25.0 and costs.step_ms(12) == 55.0
    assert RowCosts((4,), (8.0,)).step_ms(8) == 16.0 and RowCosts((4,), (8.0,)).step_ms(2) == 8.0


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: RowCosts((), ()), "probe"),
        (lambda: RowCosts((1, 4), (10.0,)), "one ms per row count"),
        (lambda: RowCosts((4, 1), (1.0, 2.0)), "increasing"),
        (lambda: RowCosts((1, 4), (10.0, -3.0)), "-3.0"),
        (lambda: RowCosts((1,), (float("nan"),)), "nan"),
        (lambda: RowCosts((1,), (float("inf"),)), "inf"),
        (lambda: RowCosts((1,), (10.0,), overhead_ms=-1.0), "overhead_ms"),
        (lambda: ServerLoad(-1), "running=-1"),
        (lambda: ServerLoad(0, 0, 0), "max_running=0"),
        (lambda: AnswerShape(100, 30, (), 8), "branch_tokens"),
        (lambda: AnswerShape(-5, 30, (40,), 8), "normal_tokens=-5"),
        (lambda: decide(XEON, ServerLoad(), held_out_shape(300), margin=1.5), "margin=1.5"),
    ],
)
def test_bad_inputs_are_refused_naming_the_value_and_the_fix(make, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(".", r"\.")) as error:
        make()
    assert any(word in str(error.value) for word in ("must", "pass", "re-run", "need"))


def test_the_length_book_starts_from_priors_and_follows_what_it_sees():
    book, config = LengthBook(window=3), SoTConfig()
    prior = book.shape(config, None)
    # Five points share what the prior normal length leaves after the prior skeleton: SoT is
    # priced writing at least as much as the normal answer, and at least what it aims at.
    # A point ends half a sentence past its aim (budget.HALF_SENTENCE_TOKENS).
    aim = max(POINT_AIM_TOKENS + HALF_SENTENCE_TOKENS, (EXPECTED_ANSWER_TOKENS - PRIOR_SKELETON_TOKENS) // 5)
    assert prior.normal_tokens == EXPECTED_ANSWER_TOKENS and book.normal() is None
    assert prior.branch_tokens == (aim,) * 5
    assert book.shape(config, 100).normal_tokens == 100  # the cap bounds the normal answer
    for tokens in (60, 70, 80, 90):
        book.observe_normal(tokens)
    book.observe_sot(24, [40, 50, 45])
    seen = book.shape(config, None)
    assert seen.normal_tokens == 80 == book.normal() and seen.skeleton_tokens == 24  # the last 3: 70, 80, 90
    # Three points priced at what the runner aims each at (the 18 tokens a share of 80 - 24 would
    # give is less); the 45 the branches wrote is below that aim's budget, so it is their length.
    assert seen.branch_tokens == (45,) * 3
    assert book.info()["seen"] == {"normal": 3, "sot": 1}
    for tokens in (30, 300, 310):
        book.observe_normal(tokens)
    assert book.normal() == 300


def test_a_priced_route_turns_normal_only_where_sot_would_be_slower_and_keeps_the_numbers():
    from sglang_specsot.sot.phases import RoutePhase, route_trace
    from sglang_specsot.sot.router import RouteDecision
    from sglang_specsot.sot.runner import priced_route

    suitable, direct = RoutePhase(RouteDecision(True, "list_ask", "a list"), 0.0), RoutePhase(
        RouteDecision(False, "math", "math"), 0.0)  # fmt: skip
    slower = decide(EPYC_AVX2, ServerLoad(), held_out_shape(317))
    priced = priced_route(suitable, slower)
    assert (priced.decision.use_sot, priced.decision.rule, priced.decision.reason) == (False, "latency", slower.reason)
    assert priced.decision.source == suitable.decision.source  # the router that found it suitable
    assert route_trace(priced)["latency"] == slower.info()
    faster = decide(XEON, ServerLoad(), held_out_shape(317))
    assert priced_route(suitable, faster).decision == suitable.decision
    assert priced_route(direct, faster).decision == direct.decision  # the router's "no" stands
    assert "latency" not in route_trace(suitable)
