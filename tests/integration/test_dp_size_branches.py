"""One SPECSOT SmolLM2 server with `--dp-size 2`, one core per rank: server-side SoT pins its
generations with `routed_dp_rank` (serving/dp_placement.py). Under "spread" an answer's
branches run on both ranks, each from a shared prefix committed on its rank (cached_tokens);
a client's own routed_dp_rank keeps the whole answer there, and one the server lacks is a 400.

Long tier: a two-rank server on two cores.
"""

from __future__ import annotations

import threading
import urllib.error

import pytest

from tests.integration.conftest import WATCHED_ARGS, cpu_args, is_idle, leak_checked_server, wait_for
from tests.integration.gateway import http

pytestmark = [pytest.mark.integration, pytest.mark.long]

SUITABLE = "How can I improve my time management skills?"
CONFIG = {"skeleton_max_tokens": 96, "max_points": 3, "max_running": 3, "default_branch_tokens": 24,
          "min_branch_tokens": 8, "router_min_answer_tokens": 1}  # fmt: skip
SPECSOT = ["--speculative-algorithm", "SPECSOT", "--speculative-num-draft-tokens", "4"]


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    # SGLang's CPU binding takes one '|'-separated core set per rank (numa_utils.py).
    env = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "SGLANG_SPECSOT_DP_BRANCHES": "spread"}
    args = cpu_args() + ["--enable-custom-logit-processor", "--dp-size", "2"] + SPECSOT + WATCHED_ARGS
    log = tmp_path_factory.mktemp("dp2") / "server.log"
    with leak_checked_server(smollm2_path, args, log, env=env) as process:
        yield process


def _sot(server, **extra) -> dict:
    body = {"model": "default", "messages": [{"role": "user", "content": SUITABLE}], "temperature": 0,
            "max_tokens": 200, "specsot": {"mode": "on", "config": CONFIG}} | extra  # fmt: skip
    return http(f"{server.base_url}/v1/chat/completions", body, timeout=600)


def _branches(reply: dict) -> list[dict]:
    meta = reply["metadata"]["specsot"]
    assert meta["path"] == "sot", meta
    items = meta["branches"]["items"]
    assert len(items) >= 2, items
    return items


def test_each_rank_runs_on_its_own_core(server):
    # SGLang binds only on AMX or arm64 CPUs; elsewhere the plugin does (cpu/threads.py).
    log = server.log_path.read_text(errors="replace")
    if "init_cpu_threads_env and shared memory based AllReduce is disabled" in log:
        assert "pinned to cores [0]" in log and "pinned to cores [1]" in log, log[-2000:]


def test_spread_runs_the_branches_on_both_ranks_each_from_its_committed_prefix(server):
    items = _branches(_sot(server))
    assert {item["dp_rank"] for item in items} == {0, 1}, items
    for item in items:
        # Each rank held question and skeleton before its branches ran: a branch prefilled its
        # own point line only, on the skeleton's rank and on the other alike.
        own = item["prompt_tokens"] - item["cached_tokens"]
        assert 0 < own <= 40 and item["cached_tokens"] > own, item


def test_a_clients_routed_dp_rank_keeps_the_whole_answer_on_that_rank(server):
    items = _branches(_sot(server, routed_dp_rank=1))
    assert {item["dp_rank"] for item in items} == {1}, items


def test_a_rank_the_server_lacks_is_refused_and_the_server_keeps_serving(server):
    with pytest.raises(urllib.error.HTTPError) as refused:
        _sot(server, routed_dp_rank=2)
    assert refused.value.code == 400
    assert "routed_dp_rank=2 out of range [0, 2)" in refused.value.read().decode()
    assert _branches(_sot(server))


def test_sot_and_plain_answers_at_once_over_both_ranks_then_idle(server):
    replies: list = [None] * 4

    def ask(i: int) -> None:
        if i % 2:
            body = {"model": "default", "messages": [{"role": "user", "content": "Name three colours."}],
                    "temperature": 0, "max_tokens": 48}  # fmt: skip
            replies[i] = http(f"{server.base_url}/v1/chat/completions", body, timeout=600)
        else:
            replies[i] = _sot(server)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=900)
    for reply in replies:
        assert reply is not None and reply["choices"][0]["message"]["content"].strip(), reply
    for reply in replies[::2]:
        assert {item["dp_rank"] for item in _branches(reply)} == {0, 1}
    wait_for(lambda: is_idle(server), "the server to go idle")
