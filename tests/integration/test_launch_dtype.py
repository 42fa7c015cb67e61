"""A CPU server launched without `--dtype` (SmolLM2-135M) runs the dtype its start-up timing
chose, says which and why in its log, and serves in it.

Which dtype wins depends on the machine (bf16 where the CPU has it natively, float32 where
oneDNN converts bf16 operands); the unit tests (tests/unit/cpu/test_dtype.py) show both
outcomes through SGLang's argument resolution. Here the real launch: the log line, and the
dtype the server reports agreeing with it.
"""

from __future__ import annotations

import re

import pytest

from sglang_specsot.costs.dtype_choice import LOG_MARKER
from sglang_specsot.launch import ServerProcess
from tests.integration.conftest import RULES_ROUTER_ENV, cpu_args

pytestmark = pytest.mark.integration


def _without_dtype(args: list[str]) -> list[str]:
    i = args.index("--dtype")
    return args[:i] + args[i + 2 :]


def test_a_launch_without_dtype_says_what_it_runs_and_runs_it(smollm2_path, tmp_path):
    server = ServerProcess(smollm2_path, _without_dtype(cpu_args()), env=RULES_ROUTER_ENV, log_path=tmp_path / "server.log")
    with server:
        reply = server.post("/generate", {"text": "The capital of France is",
                                          "sampling_params": {"max_new_tokens": 8, "temperature": 0}})  # fmt: skip
        reported = server.get("/server_info")["dtype"]
        log = server.log_path.read_text()
    said = re.search(re.escape(LOG_MARKER) + r" running (\w+) \((.+)\)", log)
    assert said, f"no dtype choice in the log:\n{log[-3000:]}"
    chosen, why = said.groups()
    assert "ms" in why and "pass --dtype" in log
    # float32 is declared to SGLang; the half dtype is SGLang's own `auto` (the checkpoint's).
    assert reported == ("float32" if chosen == "float32" else "auto"), (chosen, reported)
    assert reply["meta_info"]["completion_tokens"] == 8
