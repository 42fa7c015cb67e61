"""On a SPECSOT server with SGLang's priority scheduling (SmolLM2-135M, the session's shared
server, launched with `--enable-priority-scheduling`), an admitted SoT answer's
branches and their shared prefix carry their request's priority one step ahead, the skeleton
its own, and the answer comes back whole (serving/priority.py). The order this gives the waiting
queue is SGLang's (schedule_policy.py, `_sort_by_priority_and_fcfs`); here, that the priorities
reach SGLang's scheduler as set."""

from __future__ import annotations

import re

import pytest

from tests.integration.conftest import RECEIVED_RID, SHARED_SPECSOT_ARGS, log_since, log_size

pytestmark = pytest.mark.integration

CONFIG = {"skeleton_max_tokens": 96, "max_points": 3, "max_running": 2, "default_branch_tokens": 16,
          "min_branch_tokens": 8, "router_min_answer_tokens": 1}  # fmt: skip
assert "--enable-priority-scheduling" in SHARED_SPECSOT_ARGS
PRIORITY = re.compile(r"Receive: obj=GenerateReqInput\(.*?rid='specsot-[0-9a-f]+-(?P<role>[a-z]+)\d*-\d+'.*?priority=(?P<p>-?\d+|None)")


def test_branches_run_one_priority_step_ahead_of_their_request(shared_specsot_server):
    server = shared_specsot_server
    start = log_size(server)
    body = {"model": "default", "messages": [{"role": "user", "content": "How can I improve my time management skills?"}],
            "temperature": 0, "max_tokens": 160, "priority": 7, "specsot": {"mode": "on", "config": CONFIG}}  # fmt: skip
    reply = server.post("/v1/chat/completions", body)
    log = log_since(server, start)
    assert reply["metadata"]["specsot"]["path"] == "sot", reply["metadata"]
    seen = {(m["role"], m["p"]) for m in PRIORITY.finditer(log)}
    assert sot_roles(log) == {"skeleton", "prefix", "branch"}, log[-2000:]
    assert seen == {("skeleton", "7"), ("prefix", "8"), ("branch", "8")}, seen


def sot_roles(log: str) -> set[str]:
    return {m["role"] for m in RECEIVED_RID.finditer(log)}
