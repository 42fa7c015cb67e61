"""Server-side SoT's limits and caps on a real SPECSOT server (SmolLM2-135M, CPU, greedy):
`max_tokens` caps the whole answer, what SGLang refuses SoT refuses alike, a client's
config beyond the operator's limits is a 400, concurrent SoT answers are bounded (429 past
the queue), and an aborted branch ends the stream as SGLang ends its own."""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request

import pytest

from sglang_specsot.launch import ServerProcess
from sglang_specsot.sot.limits import LIMITS_ENV
from tests.integration.conftest import (
    RULES_ROUTER_ENV,
    SPECSOT,
    STRICT_MEM_CHECK_ENV,
    abort_request,
    assert_idle_memory_check_passed,
    cpu_args,
    paused,
    stream_data,
    wait_for,
)
from tests.integration.parity import load_tokenizer

pytestmark = pytest.mark.integration

QUESTION = "How can I improve my time management skills?"
# Small limits, so one server shows each of them: the queue holds one SoT answer behind one.
LIMITS = {"max_branches": 6, "max_running": 3, "max_branch_tokens": 96, "max_answer_tokens": 400,
          "max_groups": 1, "max_waiting_groups": 1}  # fmt: skip
ON = {"mode": "on", "config": {"router_min_answer_tokens": 1}}
HANG_GUARD = 600  # seconds: a hung request fails instead of stalling the suite


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    """A SPECSOT server with the small LIMITS, under SGLang's strict idle memory check."""
    env = {**STRICT_MEM_CHECK_ENV, **RULES_ROUTER_ENV, LIMITS_ENV: json.dumps(LIMITS)}
    args = cpu_args() + SPECSOT + ["--context-length", "2048"]
    log = tmp_path_factory.mktemp("sot_limits") / "server.log"
    with ServerProcess(smollm2_path, args, env=env, log_path=log) as srv:
        yield srv
        assert_idle_memory_check_passed(srv)


def chat(specsot: dict | None = None, question: str = QUESTION, **extra) -> dict:
    body = {"model": "default", "messages": [{"role": "user", "content": question}], "temperature": 0, **extra}
    return {**body, "specsot": specsot} if specsot is not None else body


def post(server: ServerProcess, payload: dict) -> tuple[int, dict]:
    req = urllib.request.Request(server.base_url + "/v1/chat/completions", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=HANG_GUARD) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def message(reply: dict) -> str:
    return reply.get("message") or reply.get("error", {}).get("message", "")


def assert_serves(server: ServerProcess) -> None:
    status, reply = post(server, chat(ON, max_tokens=120))
    assert status == 200, reply


# -- max_tokens caps the whole answer -------------------------------------------------------------


# Each key with two caps, four cases where the full matrix was eight: both keys reach the same
# cap (tests/unit cover the arithmetic); 16 is below a skeleton and two branches, so SGLang's
# handler answers, 300 is near the server's max_answer_tokens.
@pytest.mark.parametrize(
    ("key", "cap"), [("max_tokens", 16), ("max_completion_tokens", 50), ("max_tokens", 150), ("max_completion_tokens", 300)]
)
def test_the_cap_bounds_the_answers_completion_tokens(server, key, cap):
    config = {"router_min_answer_tokens": 1, "max_points": 6, "min_branch_tokens": 8, "default_branch_tokens": 64}
    status, reply = post(server, chat({"mode": "on", "config": config}, **{key: cap}))
    assert status == 200, reply
    assert reply["usage"]["completion_tokens"] <= cap, reply["metadata"]
    # Below what a skeleton and two branches need, SGLang's own handler answers.
    if cap < 16 + 2 * 8:
        assert reply["metadata"]["specsot"]["route"]["rule"] == "cap_too_small"


def test_the_server_limit_caps_an_answer_without_max_tokens(server):
    config = {"router_min_answer_tokens": 1, "max_points": 6, "default_branch_tokens": 96}
    status, reply = post(server, chat({"mode": "on", "config": config}))
    assert status == 200, reply
    assert reply["usage"]["completion_tokens"] <= LIMITS["max_answer_tokens"]


@pytest.mark.parametrize("extra, status, says", [
    ({"max_tokens": 0}, 200, ""),  # SGLang's empty answer
    ({"max_tokens": -1}, 400, "max_new_tokens must be at least 0"),
    ({"max_completion_tokens": -5}, 400, "max_new_tokens must be at least 0"),
    ({"max_tokens": 10**9}, 400, "context length|too large"),
    ({"max_completion_tokens": 2048}, 400, "context length|too large"),  # prompt + 2048 > 2048
])  # fmt: skip
def test_caps_sglang_refuses_or_reads_oddly_are_answered_as_sglang_answers_them(server, extra, status, says):
    plain_status, plain = post(server, chat(None, **{"max_tokens": 8, **extra}))
    sot_status, sot = post(server, chat(ON, **{"max_tokens": 8, **extra}))
    assert plain_status == status == sot_status, (plain, sot)
    if status != 200:
        assert message(sot) == message(plain) and re.search(says, message(plain)), message(plain)
    else:
        assert sot["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"] == 0


def test_sot_still_answers_after_the_refused_caps(server):
    # After the cases above, in file order: one whole SoT answer, not one after each case.
    assert_serves(server)


def near_context_question(model_path: str, tokens: int) -> str:
    """QUESTION after background text, `tokens` SmolLM2 tokens in all."""
    tokenizer = load_tokenizer(model_path)
    sentence = "Meetings, email and errands fill my days, and I lose track of what matters. "
    per = len(tokenizer.encode(sentence))
    return sentence * ((tokens - len(tokenizer.encode(QUESTION))) // per) + QUESTION


@pytest.mark.parametrize("stream", [False, True])
def test_a_question_near_the_context_gets_an_answer_not_an_error(server, smollm2_path, stream):
    # About 1,800 of the 2,048 tokens: the skeleton fits, but a branch prompt (question and
    # skeleton) plus its budget does not. SGLang would refuse such a branch after the skeleton
    # was streamed (a 400 inside a 200), so budgets are cut to the room left (serving/backend.py).
    body = chat(ON, question=near_context_question(smollm2_path, 1_800))
    if not stream:
        status, reply = post(server, body)
        assert status == 200, reply
        assert reply["choices"][0]["message"]["content"].strip() and reply["usage"]["completion_tokens"] > 0
    else:
        data = list(stream_data(server, body, timeout=HANG_GUARD))
        assert data[-1] == "[DONE]" and not [d for d in data if '"error"' in d], data[-3:]
        events = [json.loads(d) for d in data[:-1]]
        assert "".join(c["delta"].get("content") or "" for e in events for c in e["choices"]).strip()


def test_empty_messages_say_so(server):
    status, reply = post(server, {"model": "default", "messages": [], "specsot": ON})
    assert status == 400 and "Messages cannot be empty" in message(reply)


# -- the operator's limits ---------------------------------------------------------------------


@pytest.mark.parametrize("config, names", [
    ({"max_points": 60, "max_branches": 60}, "max_branches=6"),
    ({"max_running": 1000}, "max_running=3"),
    ({"max_branch_tokens": 10**6, "default_branch_tokens": 10**6}, "max_branch_tokens=96"),
    ({"skeleton_max_tokens": 10**9}, "max_skeleton_tokens=512"),
])  # fmt: skip
def test_a_config_beyond_a_limit_is_a_400_naming_it(server, config, names):
    status, reply = post(server, chat({"mode": "on", "config": config}, max_tokens=100))
    assert status == 400 and names in message(reply) and "above the server limit" in message(reply)


def test_sot_answers_beyond_the_queue_get_429_and_the_queued_ones_finish(server):
    slow = {"mode": "on", "config": {"router_min_answer_tokens": 1, "default_branch_tokens": 96, "min_branch_tokens": 8}}
    results: dict[str, tuple[int, dict]] = {}
    first_chunk = threading.Event()

    def running():
        lines = stream_data(server, chat(slow, max_tokens=300))
        next(lines)
        first_chunk.set()
        results["running"] = (200, {"chunks": list(lines)})

    def later(name: str):
        results[name] = post(server, chat(slow, max_tokens=200))

    threads = [threading.Thread(target=running)]
    threads[0].start()
    assert first_chunk.wait(HANG_GUARD)
    # SGLang paused in place: the running answer holds the one SoT slot until it resumes, however
    # slow this CPU is. Of two more answers, whichever reaches the gate first waits in the queue
    # (max_waiting_groups=1) and the other is refused at once: wait for that 429, not a sleep.
    with paused(server):
        threads += [threading.Thread(target=later, args=(name,)) for name in ("a", "b")]
        for thread in threads[1:]:
            thread.start()
        wait_for(lambda: any(results.get(name, (0,))[0] == 429 for name in ("a", "b")), "a 429 past the queue")
    for thread in threads:
        thread.join(HANG_GUARD)
    (status, reply), (queued_status, queued) = sorted((results["a"], results["b"]), key=lambda r: -r[0])
    assert status == 429 and "max_groups=1" in message(reply), reply
    assert queued_status == 200 and queued["metadata"]["specsot"]["path"] in ("sot", "normal"), queued
    assert results["running"][1]["chunks"][-1] == "[DONE]"


# -- an aborted branch ---------------------------------------------------------------------------


def test_an_aborted_branch_ends_the_stream_with_finish_reason_abort(server):
    config = {"router_min_answer_tokens": 1, "default_branch_tokens": 96, "min_branch_tokens": 8}
    lines = stream_data(server, chat({"mode": "on", "config": config}, max_tokens=400))
    first = json.loads(next(lines))
    group = first["id"].removeprefix("chatcmpl-specsot-")
    stop = threading.Event()

    def abort_branches():  # branch rids are specsot-<group>-branch<point>-<n>, n from 2 (serving/backend.py)
        while not stop.is_set():
            for point in range(8):
                for n in range(2, 12):
                    abort_request(server, f"specsot-{group}-branch{point}-{n}")
            stop.wait(0.2)

    aborter = threading.Thread(target=abort_branches)
    aborter.start()
    try:
        rest = list(lines)
    finally:
        stop.set()
        aborter.join(60)
    assert rest[-1] == "[DONE]"
    last = json.loads(rest[-2])
    assert "error" not in last, last  # not a BadRequestError 400 inside a 200 stream
    assert last["choices"][0]["finish_reason"] == "abort"
    assert_serves(server)
