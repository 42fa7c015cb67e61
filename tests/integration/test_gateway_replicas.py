"""Two SmolLM2 replicas, one core each, behind SGLang's model gateway (`smg`), by its
`round_robin` and `cache_aware` policies: concurrent SoT and plain requests are all answered in
full, each SoT answer with its metadata, run whole on one replica (the gateway routes the request,
the replica runs its skeleton and branches), whose radix cache gives every branch the shared
prompt; a client leaving the gateway mid-answer stops the SoT group on its replica.

Long tier: two servers and a gateway on two cores.
"""

from __future__ import annotations

from http.client import HTTPConnection
import json
import threading
from contextlib import ExitStack
from urllib.parse import urlparse

import pytest

from tests.integration.conftest import (
    ABORTED_RID, HANG_GUARD, RECEIVED_RID, WATCHED_ARGS, cpu_args, is_idle, leak_checked_server, load_snapshot,
    log_since, log_size, sot_rids, wait_for,
)  # fmt: skip
from tests.integration.gateway import gateway, http

pytestmark = [pytest.mark.integration, pytest.mark.long]

SUITABLE = ["How can I improve my time management skills?", "What are the benefits of learning a second language?"]
PLAIN = ["Name three colours.", "What is the capital of Australia?"]
CONFIG = {"skeleton_max_tokens": 96, "max_points": 3, "max_running": 2, "default_branch_tokens": 24,
          "min_branch_tokens": 8, "router_min_answer_tokens": 1}  # fmt: skip
UNBOUNDED = {**CONFIG, "default_branch_tokens": 1000, "max_branch_tokens": 1000}  # only an abort ends them early
REPLICA_ARGS = cpu_args() + ["--enable-custom-logit-processor"] + WATCHED_ARGS


@pytest.fixture(scope="module")
def replicas(smollm2_path, tmp_path_factory):
    # SGLang's own CPU binding: each replica's OpenMP threads on its own core.
    with ExitStack() as stack:
        servers = [
            stack.enter_context(leak_checked_server(
                smollm2_path, REPLICA_ARGS, tmp_path_factory.mktemp(f"replica{core}") / "server.log",
                env={"SGLANG_CPU_OMP_THREADS_BIND": str(core)}))
            for core in (0, 1)
        ]  # fmt: skip
        yield servers


def test_each_replica_runs_on_its_own_core(replicas):
    # SGLang binds only on AMX or arm64 CPUs; elsewhere the plugin does (cpu/threads.py).
    for core, server in zip((0, 1), replicas):
        log = server.log_path.read_text(errors="replace")
        if "init_cpu_threads_env and shared memory based AllReduce is disabled" in log:
            assert f"pinned to cores [{core}]" in log, log[-2000:]


@pytest.fixture(scope="module", params=["round_robin", "cache_aware"])
def through(request, replicas, tmp_path_factory):
    log = tmp_path_factory.mktemp(f"smg-{request.param}") / "smg.log"
    with gateway([s.base_url for s in replicas], log, policy=request.param) as url:
        yield url


def _body(question: str, specsot: dict | None = None, stream: bool = False, max_tokens: int | None = 160) -> dict:
    body = {"model": "default", "messages": [{"role": "user", "content": question}], "temperature": 0,
            "stream": stream}  # fmt: skip
    return body | ({"specsot": specsot} if specsot else {}) | ({"max_tokens": max_tokens} if max_tokens else {})


def _ask_all(url: str, bodies: list[dict]) -> list[dict]:
    replies: list = [None] * len(bodies)

    def ask(i: int) -> None:
        replies[i] = http(f"{url}/v1/chat/completions", bodies[i], timeout=600)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=900)
    return replies


@pytest.fixture(scope="module")
def model(replicas) -> str:
    return http(f"{replicas[0].base_url}/v1/models")["data"][0]["id"]  # the gateway routes by the served name


def test_gateway_replicas_answer_sot_and_plain_at_once(replicas, through, model):
    starts = [log_size(s) for s in replicas]
    bodies = [_body(q, {"mode": "on", "config": CONFIG}) for q in SUITABLE] + [_body(q) for q in PLAIN]
    replies = _ask_all(through, [b | {"model": model} for b in bodies])
    for reply in replies:
        assert reply is not None, "a request through the gateway was not answered"
        choice = reply["choices"][0]
        assert choice["finish_reason"] in ("stop", "length") and choice["message"]["content"].strip(), reply
    logs = [log_since(s, start) for s, start in zip(replicas, starts)]
    for reply in replies[: len(SUITABLE)]:
        meta = reply["metadata"]["specsot"]
        assert meta["path"] == "sot", meta
        items = meta["branches"]["items"]
        assert len(items) >= 2, items
        for item in items:
            # The replica's radix cache held the shared prompt (question and skeleton): each
            # branch prefilled its own point line only.
            own = item["prompt_tokens"] - item["cached_tokens"]
            assert 0 < own <= 40 and item["cached_tokens"] > own, item
        ran_on = [i for i, log in enumerate(logs) if meta["group"] in sot_rids(RECEIVED_RID, log)]
        assert len(ran_on) == 1, f"SoT group {meta['group']} ran on replicas {ran_on}: not whole on one"


def test_a_client_leaving_the_gateway_stops_the_sot_group_on_its_replica(replicas, through, model):
    starts = [log_size(s) for s in replicas]
    parsed = urlparse(through)
    conn = HTTPConnection(parsed.hostname, parsed.port, timeout=600)
    body = _body(SUITABLE[0], {"mode": "on", "config": UNBOUNDED}, stream=True, max_tokens=None) | {"model": model}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200

    def running_branches() -> tuple[int, str, set[str]] | None:
        for i, (server, start) in enumerate(zip(replicas, starts)):
            for group, rids in sot_rids(RECEIVED_RID, log_since(server, start), role="branch").items():
                return i, group, rids
        return None

    wait_for(lambda: running_branches() is not None, "the SoT answer's branches to start on a replica")
    index, group, _ = running_branches()
    # Until the replica's scheduler runs them (a snapshot every decode step: WATCHED_ARGS), not a
    # sleep: then they decode, far from the 1000-token budgets, when the client leaves.
    wait_for(lambda: load_snapshot(replicas[index])["num_running_reqs"] >= 1, "the branches to decode on the replica")
    conn.close()  # the client leaves the gateway
    server = replicas[index]
    wait_for(lambda: is_idle(server), "the replica to go idle after the client left", deadline=HANG_GUARD)
    branches = sot_rids(RECEIVED_RID, log_since(server, starts[index]), role="branch")[group]
    stopped = sot_rids(ABORTED_RID, log_since(server, starts[index])).get(group, set())
    assert branches & stopped, f"no branch of group {group} was aborted: {sorted(branches)} vs {sorted(stopped)}"
