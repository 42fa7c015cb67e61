"""A bf16 CPU server with its linear weights in oneDNN's packed layout (cpu/packed_linear.py)
answers greedily what the same server with the weights as loaded answers, and its log names
the shapes it packed. Where oneDNN has no bf16 kernel (an AVX2-only CPU) nothing is packed and
the log says why; the answers agree either way.

Long tier: two SmolLM2 servers (about a minute on 2 cores); the unit tests
(tests/unit/cpu/test_packed_linear.py) cover the mechanism in every run of the default tier.
"""

from __future__ import annotations

import pytest
import torch

from sglang_specsot.cpu import packed_linear
from sglang_specsot.cpu.packed_linear import PACKED_LINEAR_ENV
from sglang_specsot.launch import ServerProcess
from tests.integration.conftest import RULES_ROUTER_ENV, cpu_args

pytestmark = [pytest.mark.integration, pytest.mark.long]

PROMPTS = ("The capital of France is", "Three tips for sleeping better:\n1.", "def fibonacci(n):")


def _bf16(args: list[str]) -> list[str]:
    i = args.index("--dtype")
    return [*args[:i], "--dtype", "bfloat16", *args[i + 2 :]]


def _answers(model: str, mode: str, log) -> tuple[list[str], str]:
    env = {**RULES_ROUTER_ENV, PACKED_LINEAR_ENV: mode}
    with ServerProcess(model, _bf16(cpu_args()), env=env, log_path=log) as server:
        texts = [server.post("/generate", {"text": p, "sampling_params": {"max_new_tokens": 24, "temperature": 0}})["text"]
                 for p in PROMPTS]  # fmt: skip
        return texts, server.log_path.read_text()


def test_packed_weights_answer_as_the_loaded_ones(smollm2_path, tmp_path):
    packed, packed_log = _answers(smollm2_path, "on", tmp_path / "on.log")
    loaded, loaded_log = _answers(smollm2_path, "off", tmp_path / "off.log")
    assert packed == loaded
    assert "oneDNN's packed layout" not in loaded_log
    if packed_linear.available(torch.bfloat16):
        assert "bfloat16 linear weights in oneDNN's packed layout" in packed_log
    else:
        assert "no oneDNN packed torch.bfloat16 linear on this CPU" in packed_log
