"""The SoT frontend program on a real CPU server with SmolLM2-135M (float32, greedy)."""

from __future__ import annotations

import pytest

from sglang_specsot.sot.prompts import title_lead_in
from sglang_specsot.bench.cells import flush_cache
from sglang_specsot.sot import SoTConfig
from sglang_specsot.sot.runner import SoTOptions

pytestmark = pytest.mark.integration

SUITABLE = "How can I improve my time management skills?"
MATH = "Solve for x: 3x + 10 = 5x - 10."
MAX_TOKENS = 96  # room for a whole skeleton: one cut by its cap falls back to a normal answer
# Small budgets keep the suite fast on two cores; router_min_answer_tokens=1 lets the rules,
# not the short cap, decide the route.
CONFIG = SoTConfig(skeleton_max_tokens=96, max_points=3, max_running=2, default_branch_tokens=16,
                   min_branch_tokens=8, router_min_answer_tokens=1)  # fmt: skip


@pytest.fixture(scope="module")
def endpoint(smollm2_server):
    from sglang_specsot.frontend import SoTEndpoint

    # The session's plain server: its KV cache flushed, so that the answer compared with a
    # SPECSOT server's below reuses nothing from other modules' answers to the same question.
    flush_cache(smollm2_server.base_url, timeout=60)
    return SoTEndpoint(smollm2_server.base_url)


@pytest.fixture(scope="module")
def render(smollm2_path):
    from sglang_specsot.frontend import chat_renderer

    return chat_renderer(smollm2_path)


@pytest.fixture(scope="module")
def sot_answer(endpoint, render):
    from sglang_specsot.frontend import answer_question

    return answer_question(endpoint, SUITABLE, render, SoTOptions("auto", CONFIG, MAX_TOKENS))


def test_suitable_question_gives_a_plan_shaped_answer(sot_answer):
    answer = sot_answer
    assert answer.path == "sot" and answer.route.decision.rule == "classifier"  # the default router
    points = answer.branches.plan.points
    assert 2 <= len(points) <= CONFIG.max_points
    assert answer.skeleton.text.startswith("1.") and answer.skeleton.result.completion_tokens > 0
    lines = answer.answer.split("\n")
    assert len(lines) == len(points)
    # "i. **Title**: body": the branch was pre-filled with its bold title (prompts.title_lead_in).
    assert all(line.startswith(f"{i}. {title_lead_in(point).rstrip(':')}") for i, (line, point) in enumerate(zip(lines, points), 1))
    results = answer.branches.results
    assert [b.index for b in results] == list(range(len(points)))
    assert all(0 < b.result.completion_tokens <= CONFIG.default_branch_tokens for b in results)
    assert answer.branches.peak_running <= CONFIG.max_running
    assert answer.completion_tokens == answer.skeleton.result.completion_tokens + sum(
        b.result.completion_tokens for b in results
    )
    trace = answer.trace()
    assert [item["text"] for item in trace["branches"]["items"]] == [b.result.text for b in results]
    assert trace["seconds"] >= trace["skeleton"]["seconds"] + trace["branches"]["seconds"] > 0


def test_a_question_naming_its_items_is_planned_by_them(endpoint, render):
    from sglang_specsot.frontend import answer_question

    question = "What are the health benefits of walking, swimming and cycling?"
    answer = answer_question(endpoint, question, render, SoTOptions("on", CONFIG, MAX_TOKENS))
    assert answer.path == "sot" and answer.skeleton.derived
    assert answer.branches.plan.points == ("Walking", "Swimming", "Cycling")
    assert all(b.result.completion_tokens > 0 for b in answer.branches.results)
    assert answer.answer.startswith("1. **Walking**")


def test_unsuitable_question_takes_the_normal_path(endpoint, render, smollm2_server):
    from sglang_specsot.frontend import answer_question

    answer = answer_question(endpoint, MATH, render, SoTOptions("auto", CONFIG, MAX_TOKENS))
    assert answer.path == "normal" and answer.route.decision.rule == "math"
    assert answer.skeleton is None and answer.branches is None
    # The normal path is exactly the model's own chat answer.
    chat = smollm2_server.post("/v1/chat/completions", {
        "model": "default", "messages": [{"role": "user", "content": MATH}],
        "temperature": 0, "max_tokens": MAX_TOKENS,
    })  # fmt: skip
    assert answer.answer == chat["choices"][0]["message"]["content"]
    assert answer.completion_tokens == chat["usage"]["completion_tokens"]


def test_unusable_skeleton_falls_back_to_the_normal_answer(endpoint, render):
    from sglang_specsot.frontend import answer_question
    from sglang_specsot.sot.budget import min_sot_tokens

    # A one-token skeleton budget cannot hold two points: parse says "direct", answer normally.
    # The answer's cap leaves SoT room (below min_sot_tokens it would not even try a skeleton).
    config = SoTConfig(skeleton_max_tokens=1, router_min_answer_tokens=1, min_branch_tokens=8,
                       default_branch_tokens=8)  # fmt: skip
    answer = answer_question(endpoint, SUITABLE, render, SoTOptions("on", config, min_sot_tokens(config)))
    assert answer.path == "normal" and answer.skeleton.parse.outcome in ("direct", "error")
    assert answer.normal.result.completion_tokens > 0 and answer.answer == answer.normal.result.text


def test_same_greedy_answer_on_a_specsot_server(shared_specsot_server, render, sot_answer):
    from sglang_specsot.frontend import SoTEndpoint, answer_question

    # Speculation is lossless, so the whole program (skeleton, every branch) must not change.
    # The session's SPECSOT server, its KV cache and drafting corpus flushed: nothing is reused
    # from the other modules' answers to this question. It runs custom logit processors, which
    # the plain server does not: the skeleton stays unconstrained on both (the constrained
    # skeleton's parity is test_skeleton_constraint_server.py's).
    flush_cache(shared_specsot_server.base_url, timeout=60)
    endpoint = SoTEndpoint(shared_specsot_server.base_url)
    options = SoTOptions("auto", CONFIG, MAX_TOKENS)
    answer = answer_question(endpoint, SUITABLE, render, options, constrain_skeleton=False)
    assert answer.skeleton.text == sot_answer.skeleton.text
    assert [b.result.text for b in answer.branches.results] == [b.result.text for b in sot_answer.branches.results]
    assert answer.answer == sot_answer.answer
