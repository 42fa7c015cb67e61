"""run_cell against servers that fail in each way it must survive: refused, silent, dead, 500."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

from sglang_specsot.bench.cells import Question, Settings, Target, from_trace, run_cell
from sglang_specsot.bench.configs import NORMAL, SAMPLED, SAMPLED_TEMPERATURE, SERVER_SOT, CellConfig, matrix
from sglang_specsot.bench.store import FAILED, OK

QUESTION = Question(7, "How can I sleep better?", True)
PLAIN = CellConfig("plain", "plain", NORMAL)
SOT = CellConfig("SoT-server", "plain", SERVER_SOT, "on")
render = lambda messages: messages[0]["content"]  # noqa: E731


class FakeServer(http.server.BaseHTTPRequestHandler):
    replies: dict = {}
    busy_flushes = 0  # how many /flush_cache calls answer 400 first, as a busy SGLang does
    received: dict = {}  # path -> the last JSON body posted there
    log: list = []  # (path, JSON body) of every post, in order

    def do_POST(self):  # noqa: N802 - the handler's API
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        FakeServer.received[self.path] = json.loads(raw) if raw else None
        FakeServer.log.append((self.path, FakeServer.received[self.path]))
        status, body = self.replies.get(self.path, (404, {"error": "no route"}))
        if self.path == "/flush_cache" and FakeServer.busy_flushes > 0:
            FakeServer.busy_flushes -= 1
            status, body = 400, {"message": "Flush cache failed."}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


TRACE = {"path": "sot", "fallback": False, "usage": {"completion_tokens": 30},
         "skeleton": {"text": "1. a\n2. b", "points": ["a", "b"], "seconds": 1.0, "parse_seconds": 0.5},
         "branches": {"items": [{"index": 0, "started": 0.0, "finished": 2.0, "completion_tokens": 10, "finish_reason": "stop"},
                                {"index": 1, "started": 0.1, "finished": 3.0, "completion_tokens": 12, "finish_reason": "length"}]}}  # fmt: skip


def test_from_trace_places_branches_after_the_skeleton():
    fields = from_trace(TRACE)
    assert fields["path"] == "sot" and fields["points"] == 2 and fields["finish_reason"] == "length"
    assert [(b.start, b.end) for b in fields["branches"]] == [(1.5, 3.5), (1.6, 4.5)]
    assert fields["output_tokens"] == 30
    assert fields["empty_points"] is None  # a trace without a merge (a fallback) counts none


def test_from_trace_keeps_the_latency_models_decision():
    decision = {"use_sot": False, "normal_ms": 9000.0, "sot_ms": 12000.0, "ratio": 1.333, "reason": "a normal answer"}
    assert from_trace({"path": "normal", "route": {"rule": "latency", "latency": decision}})["route_latency"] == decision
    assert from_trace(TRACE)["route_latency"] is None


def test_from_trace_counts_the_points_the_merge_found_empty():
    assert from_trace({**TRACE, "merge": {"seconds": 0.0, "empty_points": [1]}})["empty_points"] == 1
    assert from_trace({**TRACE, "merge": {"seconds": 0.0, "empty_points": []}})["empty_points"] == 0


def test_a_normal_cell_reads_generate(fake):
    FakeServer.replies = {"/flush_cache": (200, {}), "/generate": (200, {"text": "Sleep early. Sleep early. Sleep early. " * 3,
                          "meta_info": {"completion_tokens": 48, "finish_reason": {"type": "length"}, "spec_accept_length": 1.5}})}  # fmt: skip
    result = run_cell(PLAIN, QUESTION, Target(url(fake), render), Settings(48, 10))
    assert result.status == OK and result.output_tokens == 48 and result.hit_cap and result.accept_length == 1.5
    assert result.load is not None and result.load >= 0  # the machine's load when the answer came
    assert len(result.commit) >= 7  # the code that measured it (the tests run in a checkout)
    assert result.looped  # the answer repeats itself up to the cap


def test_normal_cells_are_greedy_except_the_sampled_reference(fake):
    FakeServer.replies = {"/flush_cache": (200, {}), "/generate": (200, {"text": "Sleep early.",
                          "meta_info": {"completion_tokens": 3, "finish_reason": {"type": "stop"}}})}  # fmt: skip
    sampled = next(c for c in matrix(False) if c.name == SAMPLED)
    for cfg, temperature in ((PLAIN, 0), (sampled, SAMPLED_TEMPERATURE)):
        assert run_cell(cfg, QUESTION, Target(url(fake), render), Settings(48, 10)).status == OK
        assert FakeServer.received["/generate"]["sampling_params"]["temperature"] == temperature
    assert sampled.server == "plain" and 0 < SAMPLED_TEMPERATURE <= 1


def _template(messages):
    """A chat template's shape: a fixed header, every turn on its own lines, the reply's start."""
    turns = "".join(f"<{m['role']}>\n{m['content']}\n" for m in messages)
    return "<system>\nYou are a model.\n" * (messages[0]["role"] != "system") + turns + "<assistant>\n"


@pytest.mark.parametrize("warm", [False, True])
def test_warm_prefixes_prefill_each_fixed_prefix_after_the_flush_and_before_the_timing(fake, warm):
    from sglang_specsot.bench.cells import fixed_prefixes

    FakeServer.replies = {"/flush_cache": (200, {}), "/generate": (200, {"text": "Sleep early.",
                          "meta_info": {"completion_tokens": 3, "finish_reason": {"type": "stop"}}})}  # fmt: skip
    FakeServer.log = []
    result = run_cell(PLAIN, QUESTION, Target(url(fake), _template), Settings(48, 10, warm_prefixes=warm))
    assert result.status == OK
    prefixes = fixed_prefixes(_template)
    # The chat header, the skeleton prompt's system prompt and examples, the point prompt's system prompt.
    assert len(prefixes) == 3 and "Keep a regular bedtime" in prefixes[1]
    asked = _template([{"role": "user", "content": QUESTION.text}])
    assert all(p.endswith("\n") and QUESTION.text not in p for p in prefixes) and asked.startswith(prefixes[0])
    warmed = FakeServer.log[1:-1]  # between the flush and the answer
    assert FakeServer.log[0][0] == "/flush_cache" and FakeServer.log[-1][1]["text"] == asked
    assert warmed == ([("/generate", {"text": p, "sampling_params": {"max_new_tokens": 0}}) for p in prefixes]
                      if warm else [])  # fmt: skip


def test_a_run_system_prompt_goes_before_every_question_normal_and_sot(fake):
    from sglang_specsot.bench.cells import fixed_prefixes

    system = "Always answer in French."
    FakeServer.replies = {"/flush_cache": (200, {}), "/generate": (200, {"text": "Dormez tôt.",
                          "meta_info": {"completion_tokens": 3, "finish_reason": {"type": "stop"}}}),
                          "/v1/chat/completions": (200, {"choices": [{"message": {"content": "1. a"}}],
                                                         "metadata": {"specsot": TRACE}})}  # fmt: skip
    FakeServer.log = []
    settings = Settings(48, 10, warm_prefixes=True, system_prompt=system)
    assert run_cell(PLAIN, QUESTION, Target(url(fake), _template), settings).status == OK
    asked = _template([{"role": "system", "content": system}, {"role": "user", "content": QUESTION.text}])
    assert FakeServer.log[-1][1]["text"] == asked
    prefixes = fixed_prefixes(_template, system)  # warmed: the prefixes of the prompts asked
    assert [body["text"] for _, body in FakeServer.log[1:-1]] == prefixes and asked.startswith(prefixes[0])
    assert all(system in p for p in prefixes)
    assert run_cell(SOT, QUESTION, Target(url(fake), _template), Settings(48, 10, system_prompt=system)).status == OK
    assert FakeServer.received["/v1/chat/completions"]["messages"] == [
        {"role": "system", "content": system}, {"role": "user", "content": QUESTION.text}]


def test_a_busy_flush_is_retried_until_the_server_is_idle(fake, monkeypatch):
    monkeypatch.setattr("sglang_specsot.bench.cells.FLUSH_RETRY_S", 0.01)
    FakeServer.replies = {"/flush_cache": (200, {}), "/generate": (200, {"text": "Sleep early.",
                          "meta_info": {"completion_tokens": 3, "finish_reason": {"type": "stop"}}})}  # fmt: skip
    FakeServer.busy_flushes = 3
    assert run_cell(PLAIN, QUESTION, Target(url(fake), render), Settings(48, 10)).status == OK
    assert FakeServer.busy_flushes == 0


def test_a_flush_that_stays_refused_fails_the_cell(fake, monkeypatch):
    monkeypatch.setattr("sglang_specsot.bench.cells.FLUSH_RETRY_S", 0.01)
    monkeypatch.setattr("sglang_specsot.bench.cells.FLUSH_WAIT_S", 0.05)
    FakeServer.replies = {"/flush_cache": (200, {})}
    FakeServer.busy_flushes = 10**6
    result = run_cell(PLAIN, QUESTION, Target(url(fake), render), Settings(48, 10))
    FakeServer.busy_flushes = 0
    assert result.status == FAILED and "Flush cache failed" in result.reason


def test_a_server_sot_cell_reads_the_trace_and_usage(fake):
    reply = {"choices": [{"message": {"content": "1. a x\n2. b y"}, "finish_reason": "stop"}],
             "usage": {"completion_tokens": 31}, "metadata": {"specsot": TRACE}}  # fmt: skip
    FakeServer.replies = {"/flush_cache": (200, {}), "/v1/chat/completions": (200, reply)}
    result = run_cell(SOT, QUESTION, Target(url(fake), render), Settings(48, 10))
    assert result.status == OK and result.path == "sot" and result.output_tokens == 31
    assert result.longest_branch == pytest.approx(2.9)


def test_an_http_error_is_a_failed_cell_with_its_reason(fake):
    FakeServer.replies = {"/flush_cache": (200, {}), "/generate": (500, {"error": "boom"})}
    result = run_cell(PLAIN, QUESTION, Target(url(fake), render), Settings(48, 10))
    assert result.status == FAILED and "HTTP 500" in result.reason and "boom" in result.reason


def test_a_refused_connection_is_a_failed_cell():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    result = run_cell(PLAIN, QUESTION, Target(f"http://127.0.0.1:{port}", render), Settings(48, 5))
    assert result.status == FAILED and "Connection refused" in result.reason


def test_a_silent_server_times_out_instead_of_hanging():
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        result = run_cell(PLAIN, QUESTION, Target(f"http://127.0.0.1:{port}", render), Settings(48, 1))
    assert result.status == FAILED and "timed out" in result.reason


def test_a_cell_past_its_timeout_aborts_what_it_left_running(fake, monkeypatch):
    # The abandoned request would go on decoding into the next cell's flush and timing.
    from sglang_specsot.bench import cells

    FakeServer.replies = {"/abort_request": (200, {})}
    FakeServer.received = {}
    monkeypatch.setattr(cells, "_ask", lambda *args: time.sleep(10))
    result = run_cell(PLAIN, QUESTION, Target(url(fake), render), Settings(48, 0.2))
    assert result.status == FAILED and "no answer within" in result.reason
    assert FakeServer.received["/abort_request"] == {"abort_all": True}


def test_a_request_timeout_aborts_it_on_the_server(fake, monkeypatch):
    from sglang_specsot.bench import cells

    FakeServer.replies = {"/abort_request": (200, {})}
    FakeServer.received = {}
    monkeypatch.setattr(cells, "_ask", lambda *args: (_ for _ in ()).throw(TimeoutError("timed out")))
    result = run_cell(PLAIN, QUESTION, Target(url(fake), render), Settings(48, 5))
    assert result.status == FAILED and "timed out" in result.reason
    assert FakeServer.received["/abort_request"] == {"abort_all": True}


def test_a_dead_server_fails_the_cell_without_a_request():
    target = Target("http://127.0.0.1:9", render, alive=lambda: "server plain exited with code -9 (log x.log)")
    result = run_cell(PLAIN, QUESTION, target, Settings(48, 5))
    assert result.status == FAILED and result.reason.startswith("server plain exited with code -9")


def test_the_frontend_names_frontend_cells_call_still_exist():
    """frontend.py and sot/runner.py change apart from the benchmark; the smoke run asks no
    frontend cell, so this catches a renamed parameter before a long run does."""
    import dataclasses
    import inspect

    from sglang_specsot.frontend import SoTAnswer, SoTEndpoint, answer_question  # noqa: F401
    from sglang_specsot.sot.runner import SoTOptions

    params = inspect.signature(answer_question).parameters
    assert {"render", "options", "constrain_skeleton"} <= set(params)
    assert {"mode", "config", "max_new_tokens"} <= {f.name for f in dataclasses.fields(SoTOptions)}
    assert callable(getattr(SoTAnswer, "trace", None))


def test_from_trace_reads_the_answers_accept_length():
    assert from_trace({**TRACE, "spec_accept_length": 2.5})["accept_length"] == 2.5
    assert from_trace(TRACE)["accept_length"] is None  # a server that does not speculate


def test_a_cell_sets_its_own_sot_config_over_the_runs():
    from sglang_specsot.bench.cells import sot_config

    ablation = {c.name: c for c in matrix(has_draft=False)}["SoT-server-skeleton"]
    assert sot_config(ablation, Settings(384, 60.0, {"max_points": 5, "derive_skeleton": True})) == {
        "max_points": 5, "derive_skeleton": False}
    plain_sot = {c.name: c for c in matrix(has_draft=False)}["SoT-server"]
    assert sot_config(plain_sot, Settings(384, 60.0)) is None
    assert sot_config(plain_sot, Settings(384, 60.0, {"max_points": 5})) == {"max_points": 5}


def test_from_trace_keeps_the_groups_rid_and_the_token_parts_in_skeleton_order():
    trace = {**TRACE, "group": "g7",
             "skeleton": {**TRACE["skeleton"], "prompt_tokens": 400, "completion_tokens": 9},
             "branches": {"items": [{**TRACE["branches"]["items"][1], "prompt_tokens": 130, "cached_tokens": 120},
                                    {**TRACE["branches"]["items"][0], "prompt_tokens": 128, "cached_tokens": 0}]}}  # fmt: skip
    fields = from_trace(trace)
    assert fields["rid"] == "specsot-g7"
    assert fields["token_parts"] == {"skeleton_prompt": 400, "skeleton": 9, "branch_prompts": [128, 130],
                                     "branch_cached": [0, 120]}  # fmt: skip
    assert from_trace({"path": "normal"})["rid"] == "" and from_trace({"path": "normal"})["token_parts"] is None


def test_a_normal_cell_sends_and_records_its_rid_and_token_parts(fake):
    FakeServer.replies = {"/flush_cache": (200, {}), "/generate": (200, {"text": "ok", "meta_info": {
        "completion_tokens": 3, "prompt_tokens": 11, "finish_reason": {"type": "stop"}}})}  # fmt: skip
    cell = run_cell(PLAIN, QUESTION, Target(url(fake), render), Settings(max_tokens=8, timeout=5))
    sent = FakeServer.received["/generate"]["rid"]
    assert cell.status == OK and cell.rid == sent and sent.startswith("plain-q7-")
    assert cell.token_parts == {"prompt": 11, "completion": 3}
