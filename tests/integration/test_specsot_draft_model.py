"""SPECSOT with a draft model on this CPU, float32.

Proves: greedy output token-identical to plain decoding on 36 prompts (28 Vicuna questions, 8
SoT branch prompts) at batch sizes 1..8 (through the static-shape twin the first 21, sizes 1..6), each step's draft merged with SoT-context nodes and
drafted every step (SGLANG_SPECSOT_FIXED_WINDOW=1; the cost-aware default is tested in
test_specsot_adaptive.py); drafts are accepted; SGLang's strict idle memory check finds no
leaked slot; a draft model with another vocabulary is refused at launch with the flag named,
and so is a token map with ids outside the vocabulary.

Default tier: SmolLM2-135M drafting for itself with its chain, overlap on (the draft's int8
W8A8 weights forced on, so its drafts are not always the target's tokens and verify rejects
some) with the CPU's QLEN_ONLY layout, eager, as a CPU user's server runs it, and overlap off
verifying with the GPU's FULL tree-mask layout through the static-shape twin (the CUDA path's
CPU twin), the draft's weight-only int8 kernel forced on. Long tier: Qwen2.5-Coder-0.5B with
a draft cut from it: the chain (overlap on and off), the tree (top-k 2) and the chain with its
LM head cut to the shipped Qwen2.5 token map (--speculative-token-map), the int8 kernels forced
on the overlap configs, one each, the no-overlap chain with the kernels its start-up
measurement picks.
"""

from __future__ import annotations

import re

import pytest
import torch
from sglang_specsot.cpu.draft_int8 import DRAFT_INT8_ENV
from sglang_specsot.launch import ServerProcess
from sglang_specsot.models.tiny import build_tiny_model
from sglang_specsot.speculative.static_shape import STATIC_SHAPE_ENV
from sglang_specsot.speculative.token_map import shipped_map_path
from sglang_specsot.speculative.tree_masks import LAYOUT_ENV
from tests.integration.conftest import (
    FIXED_WINDOW_ENV,
    QWEN05_PARITY_TOKENS,
    SMOLLM2_PARITY_TOKENS,
    assert_every_step_replayed_a_tier,
    cpu_args,
    leak_checked_server,
    scheduler_loop_line,
)
from tests.integration.parity import TWIN_PROMPTS, mismatches, run_batches

pytestmark = pytest.mark.integration

# SGLang counts the draft's weights against --mem-fraction-static too (is_standalone()).
COMMON = cpu_args(max_total_tokens=8192, mem_fraction_static=0.5)
MAX_NEW = 16
assert MAX_NEW <= min(QWEN05_PARITY_TOKENS, SMOLLM2_PARITY_TOKENS)  # references: prefixes of the shared runs
# The shared plain runs' 8 batches, every size 1..8 once: 28 questions and 8 branch prompts; the
# static-shape twin's, the first six batches (parity.TWIN_PROMPTS).
NUM_PROMPTS = 36
# The draft's int8 weights (cpu/draft_int8.py), whatever this machine's timing would choose, one
# kernel each: w8a8 in every product up to 16 rows, or the weight-only int8 up to 4 (wider, in
# float32, it costs seconds a forward, draft_int8.INT8_FORCED_ROWS): parity then covers both in
# each tier. Qwen's no-overlap chain keeps the measured default (long tier): its measurement at
# start-up costs most of a minute on two cores (the plan it picks: tests/unit/cpu/test_draft_int8.py).
INT8_FORCED = {"chain-overlap": "w8a8", "tree-overlap": "on", "chain-token-map": "w8a8",
               "smollm2-chain-overlap": "w8a8", "smollm2-chain-no-overlap": "on"}  # fmt: skip
TOKEN_MAP = str(shipped_map_path("qwen2.5"))
# A 3-step chain (4 nodes) plus 2 SoT-context nodes in a 6-token verify window.
CHAIN = ["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "6"]
CONFIGS = {
    "smollm2-chain-overlap": CHAIN,
    "smollm2-chain-no-overlap": CHAIN + ["--disable-overlap-schedule"],
    "chain-overlap": CHAIN,
    "chain-no-overlap": CHAIN + ["--disable-overlap-schedule"],
    # A tree: 2 steps x top-2 (5 nodes) plus 2 context nodes.
    "tree-overlap": ["--speculative-num-steps", "2", "--speculative-eagle-topk", "2",
                     "--speculative-num-draft-tokens", "7"],  # fmt: skip
    # The chain with its LM head cut to the shipped Qwen2.5 token map, then made int8.
    "chain-token-map": ["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "6",
                        "--speculative-token-map", TOKEN_MAP],  # fmt: skip
}


def _run(server, prompts) -> list[dict]:
    return run_batches(server, prompts, MAX_NEW)


def _models(request, config: str) -> tuple[str, str, tuple[list[str], list[list[int]]]]:
    """(target, draft, the plain reference) of a config, fetched only when a test of it runs: the
    default tier needs SmolLM2 alone (the session's plain SmolLM2 run is shared with other modules)."""
    if config.startswith("smollm2-"):
        target = request.getfixturevalue("smollm2_path")
        return target, target, request.getfixturevalue("smollm2_parity")
    return (request.getfixturevalue("qwen05_path"), request.getfixturevalue("qwen05_draft_path"),
            request.getfixturevalue("qwen05_parity"))  # fmt: skip


def _layout(config: str) -> str:
    """The verify mask's layout: the default tier's no-overlap config verifies with the GPU's
    FULL layout through the static-shape twin (the CUDA path's CPU twin: tiers, static buffers);
    its overlap config, what a CPU user runs, and the long tier's with the CPU's own QLEN_ONLY,
    eagerly."""
    return "full" if config == "smollm2-chain-no-overlap" else "qlen_only"


def _twin(config: str) -> str:
    return "-static_shape" if _layout(config) == "full" else ""


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(c, id=f"{c}-{_layout(c)}_layout{_twin(c)}", marks=[] if c.startswith("smollm2-") else [pytest.mark.long])
        for c in CONFIGS
    ],
)
def draft_server(request, tmp_path_factory):
    target, draft, (prompts, ids) = _models(request, request.param)
    log = tmp_path_factory.mktemp("specsot-draft") / "server.log"
    args = COMMON + ["--speculative-algorithm", "SPECSOT", "--speculative-draft-model-path", draft]
    # Its teardown, after every test on this server, proves the idle memory check passed.
    forced = INT8_FORCED.get(request.param)
    env = FIXED_WINDOW_ENV | ({DRAFT_INT8_ENV: forced} if forced else {}) | {LAYOUT_ENV: _layout(request.param)}
    env[STATIC_SHAPE_ENV] = "1" if _twin(request.param) else "0"
    with leak_checked_server(target, args + CONFIGS[request.param], log, env=env) as server:
        server.config = request.param
        # The reference: a prefix of the shared plain run, the same first batches.
        n = TWIN_PROMPTS if _twin(request.param) else NUM_PROMPTS
        server.prompts, server.plain_ids = prompts[:n], [i[:MAX_NEW] for i in ids[:n]]
        yield server


def test_greedy_parity_with_a_draft_model(draft_server):
    results = _run(draft_server, draft_server.prompts)
    bad = mismatches(results, draft_server.plain_ids)
    assert not bad, f"SPECSOT ({draft_server.config}) differs from plain decoding on prompts {bad}"
    accept = [r["meta_info"]["spec_accept_length"] for r in results]
    assert sum(accept) / len(accept) > 1.3, accept
    log = draft_server.log_path.read_text()
    assert "SPECSOT drafts with" in log  # the draft-model drafter, not the context alone
    assert f"SPECSOT verify tree mask layout: {_layout(draft_server.config).upper()}" in log
    assert scheduler_loop_line("no-overlap" not in draft_server.config) in log
    graphs = assert_every_step_replayed_a_tier(draft_server, static_shape=bool(_twin(draft_server.config)))
    if _twin(draft_server.config):
        # A draft model's tiers are 1 and the window: its draft-extend graph is captured at the window.
        assert graphs["tiers"] == [1, 6], graphs
    int8 = re.search(r"SPECSOT draft model weights in int8 .*'layers': (\d+)", log)
    # Qwen's draft measures int8 fastest on these machines.
    assert int8, "the draft model's int8 weights were not set up"
    forced = INT8_FORCED.get(draft_server.config)
    if forced:  # every dense layer, with the forced kernel, so parity above covered them
        runs = "[['w8a8', 1, 16]]" if forced == "w8a8" else "[['int8', 1, 4], ['dense', 5, 16]]"
        assert int8 and int(int8.group(1)) > 0 and runs in log
    cut = "SPECSOT draft LM head cut to 49152 of 151936 tokens" in log
    assert cut == (draft_server.config == "chain-token-map"), "the token map was not applied as configured"


@pytest.mark.long  # a Qwen model's load; the vocabulary refusal below stays in the default tier
def test_a_token_map_outside_the_vocabulary_is_refused(qwen05_path, qwen05_draft_path, tmp_path):
    bad = tmp_path / "map.pt"
    torch.save([0, 1, 999_999], bad)
    args = COMMON + ["--speculative-algorithm", "SPECSOT", "--speculative-draft-model-path", qwen05_draft_path,
                     "--speculative-token-map", str(bad)]  # fmt: skip
    server = ServerProcess(qwen05_path, args, log_path=tmp_path / "server.log", startup_timeout=300)
    with pytest.raises(RuntimeError, match="exited"):
        server.start()
    assert "--speculative-token-map: ids 0..999999 outside the draft's vocabulary 0..151935" in server.log_path.read_text()


def test_draft_model_with_another_vocabulary_is_refused(smollm2_path, tmp_path):
    # A draft with more ids than SmolLM2's 49,152 could propose ids the target lacks: refused
    # from config.json at launch, before any weights load. A draft with fewer ids is a prefix
    # and passes this check; its tokenizer is then compared on the shared ids by the worker
    # (tests/unit/speculative/test_vocab_prefix.py; tests/integration/test_vocab_prefix.py).
    draft = build_tiny_model(tmp_path / "draft", vocab_size=60000, num_layers=1, hidden_size=64)
    args = COMMON + ["--speculative-algorithm", "SPECSOT", "--speculative-draft-model-path", str(draft)]
    server = ServerProcess(smollm2_path, args, log_path=tmp_path / "server.log", startup_timeout=300)
    with pytest.raises(RuntimeError, match="exited"):
        server.start()
    log = server.log_path.read_text()
    assert "SPECSOT: --speculative-draft-model-path=" in log and "its vocab_size is 60000 but the target's is 49152" in log
    assert "use a draft model with the target's tokenizer" in log
    assert "Load weight begin" not in log, "the refusal should come before any weights load"
