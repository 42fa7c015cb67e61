"""Faults in server-side SoT on a real SPECSOT server (SmolLM2-135M, float32, greedy).

An SoT request is cut mid-skeleton or mid-branch by SGLang's /abort_request on one of its
generations, or by its client leaving (streaming and not), or its client closes after the first
streamed chunk. Each time: a plain request running beside it gets exactly its solo answer, every
generation of the SoT group that was still running is aborted in SGLang's scheduler, none starts
after, the server goes idle, and the shared server's teardown proves SGLang's strict idle memory check
ran and found no leaked KV slot or request row.

SGLang is paused in place while the fault happens, so until it resumes a generation can end only
by an abort, however fast or slow this CPU is (as the disconnect test in test_sot_server.py).
"""

from __future__ import annotations

import http.client
import json
import re
import threading

import pytest

from tests.integration.conftest import (
    ABORTED_RID, RECEIVED_RID, SOT_RID, abort_request, is_idle, load_snapshot, log_since, log_size, paused,
    sot_rids, wait_for,
)  # fmt: skip

pytestmark = pytest.mark.integration

SUITABLE = "How can I improve my time management skills?"
BYSTANDER = {"model": "default", "messages": [{"role": "user", "content": "Name three colours."}],
             "temperature": 0, "max_tokens": 48}  # fmt: skip
UNBOUNDED = 1000  # a branch budget no answer reaches (under the 1024 limit): only an abort ends them early
CONFIG = {"skeleton_max_tokens": 96, "max_points": 8, "max_running": 2, "min_branch_tokens": 8,
          "default_branch_tokens": UNBOUNDED, "max_branch_tokens": UNBOUNDED,
          "router_min_answer_tokens": 1}  # fmt: skip
FINISHED_RID = re.compile(r"Finish: obj=GenerateReqInput\(.*?rid='(" + SOT_RID + ")'")


@pytest.fixture(scope="module")
def server(shared_specsot_server):
    # The session's SPECSOT server with custom logit processors (conftest.py); its teardown, after
    # the session's last request, proves SGLang's idle memory check ran and passed.
    return shared_specsot_server


@pytest.fixture(scope="module")
def bystander_answer(server) -> str:
    return server.post("/v1/chat/completions", BYSTANDER)["choices"][0]["message"]["content"]


class SoTCall:
    """One SoT chat request on its own connection, which the test can cut at any moment."""

    def __init__(self, server, stream: bool) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
        body = {"model": "default", "messages": [{"role": "user", "content": SUITABLE}], "temperature": 0,
                "stream": stream, "specsot": {"mode": "on", "config": CONFIG}}  # fmt: skip
        self.conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        self.status: int | None = None
        self.body = b""
        self.reader: threading.Thread | None = None

    def first_chunk(self) -> bytes:
        """Read the response up to its first SSE data line (the skeleton's first token)."""
        response = self.conn.getresponse()
        assert response.status == 200, response.read()
        while not (line := response.readline()).startswith(b"data: "):
            assert line, "the stream ended before its first chunk"
        return line

    def read_in_background(self) -> None:
        def read() -> None:
            response = self.conn.getresponse()
            self.status, self.body = response.status, response.read()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()

    def close(self) -> None:
        if self.conn.sock is not None:
            self.conn.sock.close()  # the client goes away without a word
        self.conn.close()


class Bystander(threading.Thread):
    """A plain request running beside the fault."""

    def __init__(self, server) -> None:
        super().__init__(daemon=True)
        self.server, self.answer = server, None

    def run(self) -> None:
        self.answer = self.server.post("/v1/chat/completions", BYSTANDER)["choices"][0]["message"]["content"]


def group_of(server, start: int) -> str:
    groups = sot_rids(RECEIVED_RID, log_since(server, start))
    assert len(groups) == 1, groups
    return next(iter(groups))


def running(server, start: int, group: str, until: int | None = None) -> set[str]:
    """The group's generations received and not finished, in the log from start to until."""
    text = log_since(server, start)
    text = text if until is None else text[: until - start]
    received = sot_rids(RECEIVED_RID, text).get(group, set())
    return received - sot_rids(FINISHED_RID, text).get(group, set())


def wait_for_phase(server, start: int, phase: str, call: SoTCall) -> None:
    """Until the SoT request's skeleton, or two of its branches, decode in the scheduler."""

    def there() -> bool:
        assert call.status in (None, 200), (call.status, call.body[:500])  # refused: say why now
        groups = sot_rids(RECEIVED_RID, log_since(server, start))
        if not groups:
            return False
        live = running(server, start, next(iter(groups)))
        if phase == "skeleton":
            return any("-skeleton-" in rid for rid in live) and load_snapshot(server)["num_running_reqs"] >= 1
        return sum("-branch" in rid for rid in live) >= 2 and load_snapshot(server)["num_running_reqs"] >= 2

    wait_for(there, f"the SoT request's {phase} to run", poll=0.02)


def cut(server, stream: bool, phase: str, how: str, fault) -> tuple[SoTCall, str, int, set[str], str]:
    """Start an SoT request beside a plain one, pause SGLang in `phase` and apply `fault`, which
    returns the generations it must abort while SGLang is still paused; then resume and return
    (the call, its group, the log offset at the pause, the generations running then, the plain
    request's answer)."""
    start = log_size(server)
    bystander = Bystander(server)
    bystander.start()
    call = SoTCall(server, stream)
    if how == "first-chunk":
        call.first_chunk()
    else:
        if how == "abort_request":
            call.read_in_background()
        wait_for_phase(server, start, phase, call)
    with paused(server) as at_pause:
        group = group_of(server, start)
        live = running(server, start, group, until=at_pause)
        assert live, "no generation of the SoT request was running at the pause"
        direct = fault(call, live)
        wait_for(lambda: direct <= aborted(server, start, group), f"SGLang to abort {sorted(direct)}")
    bystander.join(timeout=600)
    assert bystander.answer is not None, "the plain request beside the fault got no answer"
    return call, group, at_pause, live, bystander.answer


def finish_reasons(body: bytes, stream: bool) -> list[str]:
    if not stream:
        return [choice["finish_reason"] for choice in json.loads(body)["choices"]]
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert not [c for c in chunks if "error" in c], chunks
    return [choice["finish_reason"] for c in chunks for choice in c.get("choices", []) if choice.get("finish_reason")]


def aborted(server, start: int, group: str) -> set[str]:
    return sot_rids(ABORTED_RID, log_since(server, start)).get(group, set())


def assert_group_stopped(server, start: int, at_pause: int, group: str, live: set[str]) -> None:
    """Every generation of the group running at the fault was aborted (none ran on to its end),
    none started after it, and the server went idle (SGLang logs no Finish line for an aborted
    generation whose client is gone, so idleness, and the teardown's memory check, prove the rest)."""
    wait_for(lambda: live <= aborted(server, start, group), f"SGLang to abort {sorted(live)}")
    wait_for(lambda: is_idle(server), "the server to go idle after the fault")
    later = sot_rids(RECEIVED_RID, log_since(server, at_pause)).get(group, set())
    assert not later, f"generations started after the fault: {sorted(later)}"


def cases(pairs_in_default: set[tuple[str, bool]]) -> list:
    """Each phase with each stream mode, the pairs not named long: in the default tier each
    fault kind runs both phases and both stream modes, crossed the other way for the other kind
    (five cases of nine, with the first-chunk one), the rest in the long tier."""
    return [
        pytest.param(phase, stream, id=f"{'stream' if stream else 'non-stream'}-{phase}",
                     marks=[] if (phase, stream) in pairs_in_default else [pytest.mark.long])
        for phase in ("skeleton", "branch") for stream in (False, True)
    ]  # fmt: skip


@pytest.mark.parametrize(("phase", "stream"), cases({("skeleton", False), ("branch", True)}))
def test_abort_request_on_one_generation_stops_the_whole_group(server, bystander_answer, phase, stream):
    start = log_size(server)

    def fault(call: SoTCall, live: set[str]) -> set[str]:
        # Its siblings end only once SGLang resumes: the runner hears of the abort from the
        # scheduler's output, which a paused scheduler does not send.
        target = sorted(rid for rid in live if f"-{phase}" in rid)[0]
        abort_request(server, target)
        return {target}

    call, group, at_pause, live, answer = cut(server, stream, phase, "abort_request", fault)
    assert answer == bystander_answer
    call.reader.join(timeout=600)
    # The SoT client hears of it as SGLang's own clients do of a graceful abort: a 200 whose
    # finish_reason is "abort" (streamed: the last chunk's), not an error.
    assert call.status == 200, (call.status, call.body[:500])
    assert finish_reasons(call.body, stream)[-1] == "abort", call.body[-800:]
    assert_group_stopped(server, start, at_pause, group, live)
    call.close()


def disconnect(call: SoTCall, live: set[str]) -> set[str]:
    """The client goes away: SGLang cancels the request's tasks in the HTTP server, which aborts
    every running generation at once, paused or not."""
    call.close()
    return live


@pytest.mark.parametrize(("phase", "stream"), cases({("skeleton", True), ("branch", False)}))
def test_client_leaving_stops_the_whole_group(server, bystander_answer, phase, stream):
    start = log_size(server)
    call, group, at_pause, live, answer = cut(server, stream, phase, "disconnect", disconnect)
    assert answer == bystander_answer
    assert_group_stopped(server, start, at_pause, group, live)


def test_client_closing_after_the_first_chunk_stops_the_whole_group(server, bystander_answer):
    start = log_size(server)
    call, group, at_pause, live, answer = cut(server, True, "skeleton", "first-chunk", disconnect)
    assert answer == bystander_answer
    assert_group_stopped(server, start, at_pause, group, live)
