"""Server-side SoT behind /v1/chat/completions on a real CPU server (SmolLM2-135M, float32,
greedy): same answer as the frontend program, streaming order, routing, untouched requests,
bad input, and a client that disconnects mid-branch."""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.request

import pytest

from sglang_specsot.bench.cells import flush_cache
from sglang_specsot.launch import ServerProcess
from sglang_specsot.sot import SoTConfig
from sglang_specsot.sot.runner import SoTOptions
from tests.integration.conftest import stream_events

pytestmark = pytest.mark.integration

SUITABLE = "How can I improve my time management skills?"
MATH = "Solve for x: 3x + 10 = 5x - 10."
MAX_TOKENS = 96  # room for a whole skeleton: one cut by its cap falls back to a normal answer
CONFIG = {"skeleton_max_tokens": 96, "max_points": 3, "max_running": 2, "default_branch_tokens": 16,
          "min_branch_tokens": 8, "router_min_answer_tokens": 1}  # fmt: skip
IDLE_DEADLINE = 120.0  # hang guard while waiting on the server after a disconnect
# A branch budget no answer reaches (greedy branches here end by 110 tokens), at the server's
# default limit max_branch_tokens (sot/limits.py); two such branches fit the KV pool together.
UNBOUNDED = 1024
# SGLang's scheduler logs, at debug level, each unfinished request an AbortReq reaches
# (scheduler.py:5805 running, 5722 queued); branch rids are "specsot-<group>-branch<point>-<n>"
# (serving/backend.py).
ABORTED_BRANCH = re.compile(r"Abort (?:running|queued) request\. req\.rid='(specsot-\w+-branch\d+-\d+)'")
PREFILL_LINE = "Prefill batch"  # SGLang's info line for every prefill (metrics_reporter.py:754)


def chat(question: str, **extra) -> dict:
    return {"model": "default", "messages": [{"role": "user", "content": question}],
            "temperature": 0, "max_tokens": MAX_TOKENS, **extra}  # fmt: skip


def post(server: ServerProcess, payload: dict) -> tuple[int, dict]:
    try:
        return 200, server.post("/v1/chat/completions", payload)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def sot_reply(smollm2_server) -> dict:
    status, reply = post(smollm2_server, chat(SUITABLE, specsot={"mode": "on", "config": CONFIG}))
    assert status == 200, reply
    return reply


def test_server_side_sot_gives_the_frontend_programs_answer(smollm2_server, sot_reply, smollm2_path):
    from sglang_specsot.frontend import SoTEndpoint, answer_question, chat_renderer

    options = SoTOptions("on", SoTConfig(**CONFIG), MAX_TOKENS)
    frontend = answer_question(SoTEndpoint(smollm2_server.base_url), SUITABLE, chat_renderer(smollm2_path), options)
    message, trace = sot_reply["choices"][0]["message"], sot_reply["metadata"]["specsot"]
    assert trace["path"] == "sot" == frontend.path
    assert message["reasoning_content"] == frontend.skeleton.text
    assert message["content"] == frontend.answer
    assert [item["text"] for item in trace["branches"]["items"]] == [
        b.result.text for b in frontend.branches.results
    ]
    usage = sot_reply["usage"]
    assert usage["completion_tokens"] == frontend.completion_tokens  # skeleton + every branch
    assert usage["prompt_tokens"] == frontend.prompt_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert sot_reply["choices"][0]["finish_reason"] == frontend.finish_reason


def test_branches_prefill_only_their_own_point_line(smollm2_server):
    # The branches' shared prompt (question and skeleton) is prefilled once before they
    # start; each branch then finds it in the radix cache. Admitted together without that
    # commit, each would prefill the whole prompt again.
    flush_cache(smollm2_server.base_url, timeout=60)
    status, reply = post(smollm2_server, chat(SUITABLE, specsot={"mode": "on", "config": CONFIG}))
    assert status == 200, reply
    items = reply["metadata"]["specsot"]["branches"]["items"]
    assert len(items) >= 2, items
    for item in items:
        own = item["prompt_tokens"] - item["cached_tokens"]
        # the point's own line and the chat template's end of turn, not the skeleton again
        assert 0 < own <= 40 and item["cached_tokens"] > own, item


def test_stream_sends_skeleton_then_points_and_every_token_once(smollm2_server, sot_reply):
    events = stream_events(smollm2_server, chat(SUITABLE, specsot={"mode": "on", "config": CONFIG},
                                                stream_options={"include_usage": True}))  # fmt: skip
    deltas = [(c["delta"], c["finish_reason"]) for e in events for c in e["choices"]]
    kinds = [("reasoning" if d.get("reasoning_content") else "content")
             for d, _ in deltas if d.get("reasoning_content") or d.get("content")]  # fmt: skip
    assert kinds == sorted(kinds, key=["reasoning", "content"].index)  # skeleton first
    reasoning = "".join(d.get("reasoning_content") or "" for d, _ in deltas)
    content = "".join(d.get("content") or "" for d, _ in deltas)
    message = sot_reply["choices"][0]["message"]
    assert reasoning == message["reasoning_content"]
    assert content == message["content"]
    # Content arrives one whole point at a time, in skeleton order.
    pieces = [d["content"] for d, _ in deltas if d.get("content")]
    assert [p.lstrip("\n").split(".")[0] for p in pieces] == [str(i) for i in range(1, len(pieces) + 1)]
    assert [f for _, f in deltas if f] == [sot_reply["choices"][0]["finish_reason"]]
    assert events[-1]["usage"]["completion_tokens"] == sot_reply["usage"]["completion_tokens"]


def test_unsuitable_question_takes_the_normal_path(smollm2_server):
    plain = post(smollm2_server, chat(MATH))[1]
    status, routed = post(smollm2_server, chat(MATH, specsot={"mode": "auto", "config": CONFIG}))
    assert status == 200
    assert routed["metadata"]["specsot"]["path"] == "normal"
    assert routed["metadata"]["specsot"]["route"]["rule"] == "math"
    assert routed["choices"][0]["message"] == plain["choices"][0]["message"]
    assert routed["usage"] == plain["usage"]


def test_a_question_naming_its_items_is_planned_by_them(smollm2_server):
    """No skeleton is generated: the named items are the points, the plan still streams as
    reasoning_content, and every token counted is a branch's."""
    question = "What are the health benefits of walking, swimming and cycling?"
    status, reply = post(smollm2_server, chat(question, specsot={"mode": "on", "config": CONFIG}))
    assert status == 200
    trace = reply["metadata"]["specsot"]
    assert trace["path"] == "sot" and trace["skeleton"]["derived"]
    assert trace["skeleton"]["points"] == ["Walking", "Swimming", "Cycling"]
    assert trace["skeleton"]["completion_tokens"] == 0
    assert reply["choices"][0]["message"]["reasoning_content"] == "1. Walking\n2. Swimming\n3. Cycling"
    assert reply["choices"][0]["message"]["content"].startswith("1. **Walking**")
    assert reply["usage"]["completion_tokens"] == sum(b["completion_tokens"] for b in trace["branches"]["items"])


@pytest.mark.parametrize("question", [SUITABLE, "Describe the roles of the three branches of government."])
def test_the_normal_answers_first_line_decides_and_prose_is_plains_answer(smollm2_server, question):
    """The opening read beside the skeleton (sot.opening): in float32 a prose first line gives
    exactly the normal answer SGLang gives alone, and a list is answered by SoT under its intro."""
    plain = post(smollm2_server, chat(question))[1]
    status, reply = post(smollm2_server, chat(question, specsot={"mode": "on", "config": {**CONFIG, "read_opening": True}}))
    assert status == 200, reply
    trace, content = reply["metadata"]["specsot"], reply["choices"][0]["message"]["content"]
    opening = trace["opening"]
    if opening["kind"] == "prose":
        assert trace["path"] == "normal" and trace["reason"].startswith("opening: ")
        assert content == plain["choices"][0]["message"]["content"] and reply["usage"] == plain["usage"]
    else:
        assert trace["path"] in ("sot", "normal"), trace  # normal: a skeleton that is no plan
        intro = opening["text"].strip()
        assert plain["choices"][0]["message"]["content"].startswith(opening["text"])
        if trace["path"] == "sot":
            assert content.startswith(intro + "\n\n" if intro else "1. ")
            spent = [trace["skeleton"]["completion_tokens"], opening["completion_tokens"]]
            spent += [b["completion_tokens"] for b in trace["branches"]["items"]]
            assert reply["usage"]["completion_tokens"] == sum(spent)


def test_mode_auto_routes_by_the_question_classifier(smollm2_server):
    """The server's default router: past the hard rules, the classifier decides (loaded in
    the HTTP server's process at start-up)."""
    status, reply = post(smollm2_server, chat(SUITABLE, specsot={"mode": "auto", "config": CONFIG}))
    assert status == 200
    trace = reply["metadata"]["specsot"]
    route = trace["route"]
    assert route["source"] == "classifier"
    # Then the latency model priced it, by the curve the plain server's scheduler probed at
    # start-up and its load (sot/latency.py): SoT only where predicted faster by the margin.
    latency = route["latency"]
    assert latency["curve"].startswith("start-up probe"), latency
    assert latency["row_costs"]["rows"][0] == 1 and len(latency["row_costs"]["ms"]) == len(latency["row_costs"]["rows"])
    assert latency["normal_ms"] > 0 and latency["sot_ms"] > 0 and latency["margin"] == 0.15
    assert latency["running"] >= 0 and latency["waiting"] >= 0 and latency["shape"]["branch_tokens"]
    assert latency["use_sot"] == (latency["ratio"] <= 1 - latency["margin"])
    if latency["use_sot"]:
        assert route["rule"] == "classifier" and route["use_sot"]
        assert trace["path"] in ("sot", "normal")  # normal: an unusable skeleton
    else:
        assert route["rule"] == "latency" and trace["path"] == "normal" and trace["reason"] == latency["reason"]


def test_request_without_the_field_is_untouched(smollm2_server, smollm2_path):
    from sglang_specsot.frontend import chat_renderer

    status, reply = post(smollm2_server, chat(SUITABLE))
    assert status == 200 and "specsot" not in (reply.get("metadata") or {})
    assert not reply["id"].startswith("chatcmpl-specsot")
    assert reply["choices"][0]["message"]["reasoning_content"] is None
    # SGLang's own answer: the same as /generate on the chat-templated prompt.
    prompt = chat_renderer(smollm2_path)([{"role": "user", "content": SUITABLE}])
    out = smollm2_server.post("/generate", {"text": prompt,
                                            "sampling_params": {"temperature": 0, "max_new_tokens": MAX_TOKENS}})  # fmt: skip
    assert reply["choices"][0]["message"]["content"] == out["text"]
    assert reply["usage"]["completion_tokens"] == out["meta_info"]["completion_tokens"]


@pytest.mark.parametrize(
    "field, message",
    [
        ("on", '"specsot" must be an object'),
        ({"mode": "sometimes"}, '"specsot.mode" must be'),
        ({"mode": "on", "colour": "red"}, "unknown keys ['colour']"),
        ({"config": {"max_points": 0}}, "max_points=0"),
        ({"config": {"points": 3}}, "unknown fields ['points']"),
        ({"config": [1]}, '"specsot.config" must be an object'),
        ({"skeleton_logit_processor": 7}, "skeleton_logit_processor"),
    ],
)
def test_bad_field_is_a_400_with_a_message(smollm2_server, field, message):
    status, reply = post(smollm2_server, chat(SUITABLE, specsot=field))
    assert status == 400 and message in reply["message"], reply


def test_forced_sot_on_an_unsupported_request_is_a_400(smollm2_server):
    status, reply = post(smollm2_server, chat(SUITABLE, n=2, specsot={"mode": "on"}))
    assert status == 400 and "n=2" in reply["message"]
    history = chat(SUITABLE, specsot={"mode": "on"})
    history["messages"][:0] = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    status, reply = post(smollm2_server, history)
    assert status == 400 and "no history" in reply["message"]


def test_a_system_prompt_is_followed_by_the_sot_answer_as_by_the_frontend_program(smollm2_server, smollm2_path):
    from sglang_specsot.frontend import SoTEndpoint, answer_question, chat_renderer

    system = "You are a pirate. Talk like one."
    request = chat(SUITABLE, specsot={"mode": "on", "config": CONFIG})
    request["messages"].insert(0, {"role": "system", "content": system})
    status, reply = post(smollm2_server, request)
    assert status == 200 and reply["metadata"]["specsot"]["path"] == "sot", reply
    options = SoTOptions("on", SoTConfig(**CONFIG), MAX_TOKENS, system_prompt=system)
    frontend = answer_question(SoTEndpoint(smollm2_server.base_url), SUITABLE, chat_renderer(smollm2_path), options)
    assert reply["choices"][0]["message"]["reasoning_content"] == frontend.skeleton.text
    assert reply["choices"][0]["message"]["content"] == frontend.answer
    assert system in frontend.skeleton.request.prompt
    assert all(system in b.request.prompt for b in frontend.branches.results)
    # In mode "auto" a system prompt that asks for JSON keeps the answer SGLang's own.
    request["messages"][0]["content"] = "Reply in JSON."
    request["specsot"] = {"mode": "auto", "config": CONFIG}
    status, reply = post(smollm2_server, request)
    assert status == 200 and reply["metadata"]["specsot"]["route"]["rule"] == "system_structured", reply


def test_question_longer_than_the_context_is_a_400(smollm2_server):
    status, reply = post(smollm2_server, chat("why " * 9000, specsot={"mode": "on", "config": CONFIG}))
    # 36,000 characters are also past the server's max_question_chars, which mode "on" names.
    says = reply["message"].lower()
    assert status == 400 and ("context" in says or "max_question_chars=16000" in says), reply
    assert _idle(smollm2_server)


def _load(server: ServerProcess) -> dict:
    return server.get("/v1/loads")["loads"][0]


def _idle(server: ServerProcess) -> bool:
    load = _load(server)
    return load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0


def _wait_for(predicate, what: str, poll: float = 0.2) -> None:
    deadline = time.monotonic() + IDLE_DEADLINE  # a hang guard, not a speed assertion
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)


def _log_since(server: ServerProcess, start: int) -> str:
    return server.log_path.read_text()[start:]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_disconnect_mid_branch_aborts_every_running_branch(smollm2_server, stream):
    server = smollm2_server
    # No branch reaches its budget here, and SGLang is paused while the client leaves, so until
    # it resumes a branch can end only by an abort, however fast or slow this CPU is. The pause
    # lands within a few decode steps of the branches' start (fast polling, a load snapshot each
    # step); greedy, the first two branches of this plan run 58 and 110 tokens to their EOS.
    config = {**CONFIG, "max_points": 8,
              "default_branch_tokens": UNBOUNDED, "max_branch_tokens": UNBOUNDED}  # fmt: skip
    payload = chat(SUITABLE, specsot={"mode": "on", "config": config}, stream=stream, max_tokens=None)
    start = len(server.log_path.read_text())
    aborted = lambda: set(ABORTED_BRANCH.findall(_log_since(server, start)))  # noqa: E731
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    conn.request("POST", "/v1/chat/completions", json.dumps(payload), {"Content-Type": "application/json"})
    try:
        _wait_for(lambda: _load(server)["num_running_reqs"] >= 2, "two branches running", poll=0.02)
        server.post("/pause_generation", {"mode": "in_place"})
        paused = len(server.log_path.read_text())
        conn.sock.close()  # the client goes away mid-branch
        conn.close()
        _wait_for(lambda: len(aborted()) >= 2, "SGLang to abort the two running branches")
    finally:
        conn.close()
        server.post("/continue_generation", {"torch_empty_cache": False})
    _wait_for(lambda: _idle(server), "the server to go idle after the aborts")
    assert len(aborted()) == 2, sorted(aborted())  # max_running=2: both, and no other branch
    # Nothing was prefilled after the client left: no branch started in the aborted ones' place.
    assert PREFILL_LINE not in _log_since(server, paused), _log_since(server, paused)[-3000:]
