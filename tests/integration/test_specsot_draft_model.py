"""SPECSOT with a draft model on this CPU: Qwen2.5-Coder-0.5B (float32) and a draft cut from it.

Proves: greedy output token-identical to plain decoding on 36 prompts (28 Vicuna questions, 8
SoT branch prompts) at batch sizes 1..8 with the draft model's chain (overlap on and off) and
its tree (top-k 2, overlap on), and the chain with its LM head cut to the shipped Qwen2.5
token map (--speculative-token-map), each merged with SoT-context nodes and drafted every step
(SGLANG_SPECSOT_FIXED_WINDOW=1; the cost-aware default is tested in test_specsot_adaptive.py); drafts are accepted;
the draft model's int8 weights (cpu/draft_int8.py) forced on for the overlap configs, one
kernel each;
SGLang's strict idle memory check finds no leaked slot; a draft model with another vocabulary
is refused at launch with the flag named, and so is a token map with ids outside the vocabulary.
"""

from __future__ import annotations

import re

import pytest
import torch
from sglang_specsot.cpu.draft_int8 import DRAFT_INT8_ENV
from sglang_specsot.launch import ServerProcess
from sglang_specsot.speculative.token_map import shipped_map_path
from tests.integration.conftest import (
    FIXED_WINDOW_ENV,
    QWEN05_PARITY_TOKENS,
    cpu_args,
    leak_checked_server,
    scheduler_loop_line,
)
from tests.integration.parity import mismatches, run_batches

pytestmark = pytest.mark.integration

# SGLang counts the draft's weights against --mem-fraction-static too (is_standalone()).
COMMON = cpu_args(max_total_tokens=8192, mem_fraction_static=0.5)
MAX_NEW = 16
assert MAX_NEW <= QWEN05_PARITY_TOKENS  # the plain reference is a prefix of the shared run
# The draft's int8 weights (cpu/draft_int8.py) on the overlap configs, whatever this machine's
# timing would choose, one kernel each: the chain's w8a8 in every product up to 16 rows, the
# tree's weight-only int8 up to 4 (its batches of 1 and 2; wider, in float32, it costs
# seconds a forward, draft_int8.INT8_FORCED_ROWS): parity then covers both; the no-overlap
# config keeps the measured default.
INT8_FORCED = {"chain-overlap": "w8a8", "tree-overlap": "on", "chain-token-map": "w8a8"}
TOKEN_MAP = str(shipped_map_path("qwen2.5"))
CONFIGS = {
    # A 3-step chain (4 nodes) plus 2 SoT-context nodes in a 6-token verify window.
    "chain-overlap": ["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "6"],
    "chain-no-overlap": ["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "6",
                         "--disable-overlap-schedule"],  # fmt: skip
    # A tree: 2 steps x top-2 (5 nodes) plus 2 context nodes.
    "tree-overlap": ["--speculative-num-steps", "2", "--speculative-eagle-topk", "2",
                     "--speculative-num-draft-tokens", "7"],  # fmt: skip
    # The chain with its LM head cut to the shipped Qwen2.5 token map, then made int8.
    "chain-token-map": ["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "6",
                        "--speculative-token-map", TOKEN_MAP],  # fmt: skip
}


@pytest.fixture(scope="module")
def prompts(qwen05_parity) -> list[str]:
    return qwen05_parity[0]


def _run(server, prompts) -> list[dict]:
    return run_batches(server, prompts, MAX_NEW)


@pytest.fixture(scope="module")
def plain_ids(qwen05_parity) -> list[list[int]]:
    return [ids[:MAX_NEW] for ids in qwen05_parity[1]]  # a prefix of the longer plain run


# The chain, overlap on and off, in the default tier; the tree and the token map in the long one.
LONG_CONFIGS = {"tree-overlap", "chain-token-map"}


@pytest.fixture(
    scope="module",
    params=[pytest.param(c, marks=[pytest.mark.long] if c in LONG_CONFIGS else []) for c in CONFIGS],
)
def draft_server(request, qwen05_path, qwen05_draft_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("specsot-draft") / "server.log"
    args = COMMON + ["--speculative-algorithm", "SPECSOT", "--speculative-draft-model-path", qwen05_draft_path]
    # Its teardown, after every test on this server, proves the idle memory check passed.
    forced = INT8_FORCED.get(request.param)
    env = FIXED_WINDOW_ENV | ({DRAFT_INT8_ENV: forced} if forced else {})
    with leak_checked_server(qwen05_path, args + CONFIGS[request.param], log, env=env) as server:
        server.config = request.param
        yield server


def test_greedy_parity_with_a_draft_model(draft_server, prompts, plain_ids):
    results = _run(draft_server, prompts)
    bad = mismatches(results, plain_ids)
    assert not bad, f"SPECSOT ({draft_server.config}) differs from plain decoding on prompts {bad}"
    accept = [r["meta_info"]["spec_accept_length"] for r in results]
    assert sum(accept) / len(accept) > 1.3, accept
    log = draft_server.log_path.read_text()
    assert "SPECSOT drafts with" in log  # the draft-model worker, not the context-only one
    assert scheduler_loop_line("no-overlap" not in draft_server.config) in log
    int8 = re.search(r"SPECSOT draft model weights in int8 .*'layers': (\d+)", log)
    assert int8, "the draft model's int8 weights were not set up"
    forced = INT8_FORCED.get(draft_server.config)
    if forced:  # every dense layer, with the forced kernel, so parity above covered them
        runs = "[['w8a8', 1, 16]]" if forced == "w8a8" else "[['int8', 1, 4], ['dense', 5, 16]]"
        assert int(int8.group(1)) > 0 and runs in log
    cut = "SPECSOT draft LM head cut to 49152 of 151936 tokens" in log
    assert cut == (draft_server.config == "chain-token-map"), "the token map was not applied as configured"


def test_a_token_map_outside_the_vocabulary_is_refused(qwen05_path, qwen05_draft_path, tmp_path):
    bad = tmp_path / "map.pt"
    torch.save([0, 1, 999_999], bad)
    args = COMMON + ["--speculative-algorithm", "SPECSOT", "--speculative-draft-model-path", qwen05_draft_path,
                     "--speculative-token-map", str(bad)]  # fmt: skip
    server = ServerProcess(qwen05_path, args, log_path=tmp_path / "server.log", startup_timeout=300)
    with pytest.raises(RuntimeError, match="exited"):
        server.start()
    assert "--speculative-token-map: ids 0..999999 outside the draft's vocabulary 0..151935" in server.log_path.read_text()


def test_draft_model_with_another_vocabulary_is_refused(smollm2_path, tiny_model_path, tmp_path):
    args = COMMON + ["--speculative-algorithm", "SPECSOT", "--speculative-draft-model-path", tiny_model_path]
    server = ServerProcess(smollm2_path, args, log_path=tmp_path / "server.log", startup_timeout=300)
    with pytest.raises(RuntimeError, match="exited"):
        server.start()
    log = server.log_path.read_text()
    assert "SPECSOT: --speculative-draft-model-path=" in log and "use a draft model with the target's tokenizer" in log
