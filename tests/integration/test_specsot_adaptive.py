"""SPECSOT with --speculative-adaptive on this CPU: budgets change, greedy output does not.

Proves, for SoT-context drafting (SmolLM2-135M) and with a draft model (Qwen2.5-Coder-0.5B
and a 12-layer cut of it), float32: greedy output token-identical to plain decoding on the
parity prompts (36: 28 questions and 8 branch prompts) at batch sizes 1..8 with adaptive budgets
(SPECSOT's own policy, and a config in SGLang's format that alternates plain and drafted
steps), overlap on and off;
/server_info shows the measured cost model, refreshed by real steps, and the last plan; each
request's meta_info carries the draft tokens spent (spec_cap_length) beside its accept
length; SGLang's strict idle memory check finds no leaked slot. Without the flag SPECSOT runs
the same policy (every budget up to the window's), losslessly. The no-flag server and the draft
model's run through the static-shape twin of the CUDA path: however the policy sizes a step,
its verify runs at a captured tier.
"""

from __future__ import annotations

import json
import os

import pytest
from sglang_specsot.launch import ServerProcess
from sglang_specsot.speculative.static_shape import STATIC_SHAPE_ENV
from sglang_specsot.speculative.tree_masks import LAYOUT_ENV
from tests.integration.conftest import (
    QWEN05_PARITY_TOKENS,
    SMOLLM2_PARITY_TOKENS,
    SPECSOT,
    assert_every_step_replayed_a_tier,
    cpu_args,
    leak_checked_server,
    scheduler_loop_line,
)
from tests.integration.parity import generate, load_tokenizer, mismatches, parity_prompts, run_batches

pytestmark = pytest.mark.integration

MAX_NEW = 24
assert MAX_NEW == QWEN05_PARITY_TOKENS  # test_draft_model_parity_static_shape compares with the shared plain run
assert MAX_NEW <= SMOLLM2_PARITY_TOKENS  # the context-drafting tests with a prefix of SmolLM2's
# Budgets in SGLang's adaptive-config format: at batch 1 a plain step or the whole window,
# from batch 4 a plain step or one draft token; SPECSOT's own keys under "specsot".
CONFIG = {"1": {"candidate_steps": [0, 5]}, "4": {"candidate_steps": [0, 1]}, "specsot": {"decay": 0.3}}
# The CUDA path's twin (the GPU's mask layout, every step padded to a captured verify tier and
# run through static buffers): the fixed-window servers of the other files run it, and so do the
# adaptive policy's servers marked below, whose widths change step by step.
TWIN_ENV = {LAYOUT_ENV: "full", STATIC_SHAPE_ENV: "1"}
CONTEXT_ARGS = cpu_args(max_total_tokens=8192) + SPECSOT + ["--speculative-adaptive"]
MODEL_ARGS = cpu_args(max_total_tokens=8192, mem_fraction_static=0.5) + [
    "--speculative-algorithm", "SPECSOT", "--speculative-num-steps", "3",
    "--speculative-num-draft-tokens", "6", "--speculative-adaptive",
]  # fmt: skip


@pytest.fixture(scope="module")
def config_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("adaptive") / "adaptive.json"
    path.write_text(json.dumps(CONFIG))
    return str(path)


@pytest.fixture(scope="module")
def smollm2_plain(smollm2_parity):
    prompts, ids = smollm2_parity  # plain decoding with CONTEXT_ARGS' server arguments, the same batches
    return prompts, [i[:MAX_NEW] for i in ids]


def _check(server, prompts, plain_ids, label: str) -> dict:
    results = run_batches(server, prompts, MAX_NEW)
    bad = mismatches(results, plain_ids)
    assert not bad, f"adaptive SPECSOT ({label}) differs from plain decoding on prompts {bad}"
    state = server.get("/server_info")["internal_states"][0]
    report = state["specsot"]
    assert report["adaptive"] is True, report
    target = report["cost_model"]["target"]
    assert target["observed_steps"] > 0 and len(target["probe_ms"]) == len(target["probe_rows"]) > 1, target
    assert report["last_plan"] is not None and report["last_plan"]["width"] >= 1, report
    # The scheduler inherited the launcher's spin count (cpu/threads.py), unless the run set its own.
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        assert report["omp_spin"] == {"GOMP_SPINCOUNT": "10M", "OMP_WAIT_POLICY": None, "source": "sglang-specsot"}
    spent = [r["meta_info"].get("spec_cap_length", 0.0) for r in results]
    assert all("spec_accept_length" in r["meta_info"] for r in results)
    assert any(s > 0 for s in spent), "no request was given a draft"
    return report


# Each policy with each scheduler loop, three servers for the four pairs: SPECSOT's own policy
# with the overlap loop is the no-flag test below (the flag changes nothing in the policy), and
# an SGLang-format config changes the budgets, not the loop, so one loop for it is enough.
# The default policy's parity in the default tier: the CPU user's server of
# test_specsot_server.py (no flag, no environment, overlap); these and the twin below are long.
@pytest.mark.long
@pytest.mark.parametrize(
    ("with_config", "overlap"), [(False, False), (True, True)], ids=["own-policy-no-overlap", "sglang-config-overlap"]
)
def test_context_drafting_parity(smollm2_path, smollm2_plain, config_path, tmp_path, overlap, with_config):
    prompts, plain_ids = smollm2_plain
    args = CONTEXT_ARGS + ([] if overlap else ["--disable-overlap-schedule"])
    args += ["--speculative-adaptive-config", config_path] if with_config else []
    with leak_checked_server(smollm2_path, args, tmp_path / "server.log") as server:
        _check(server, prompts, plain_ids, f"context, config={with_config}, overlap={overlap}")
    log = (tmp_path / "server.log").read_text()
    assert "SPECSOT adaptive draft budgets on" in log
    assert scheduler_loop_line(overlap) in log


@pytest.mark.long  # the policy through the twin; the no-flag policy's default-tier parity is eager
def test_without_the_flag_specsot_still_decides_from_its_costs_static_shape(smollm2_path, smollm2_plain, tmp_path):
    # No --speculative-adaptive and SGLANG_SPECSOT_FIXED_WINDOW unset: the same policy, every
    # budget from 0 to the window's weighed each step, under the overlap loop (the default).
    # Lossless like every other mode.
    # Through the static-shape twin: the policy's widths, plain steps included, are tiers.
    prompts, plain_ids = smollm2_plain
    args = cpu_args(max_total_tokens=8192) + SPECSOT
    with leak_checked_server(smollm2_path, args, tmp_path / "server.log", env=TWIN_ENV) as server:
        results = run_batches(server, prompts, MAX_NEW)
        report = server.get("/server_info")["internal_states"][0]["specsot"]
        assert_every_step_replayed_a_tier(server, static_shape=True, widths=2)
    assert not mismatches(results, plain_ids), "SPECSOT (no flag) differs from plain decoding"
    assert report["budget_mode"] == "adaptive" and report["adaptive"] is True, report
    assert report["last_plan"] is not None and report["cost_model"]["target"]["observed_steps"] > 0, report
    log = (tmp_path / "server.log").read_text()
    assert "SPECSOT adaptive draft budgets on" in log
    assert scheduler_loop_line(overlap=True) in log


@pytest.mark.long
def test_draft_model_parity_static_shape(qwen05_path, qwen05_draft_path, qwen05_parity, tmp_path):
    prompts, plain_ids = qwen05_parity
    # The 12-layer draft may never pay here, and then the policy would never draft: explore
    # on schedule, often, so that drafted steps, deferred extends and catch-ups all run.
    # Exploring drafts the smallest positive candidate: 3 tokens, so that its chains run draft
    # forwards (a 1-token draft reads the last extend's top-k and runs none) and the draft's
    # cost is measured whether or not a plan ever drafts; plans still cut chains shorter
    # (per-request budgets, the draft's confidence).
    config = tmp_path / "explore.json"
    config.write_text(json.dumps({"1": {"candidate_steps": [0, 3]}, "specsot": {"explore_share": 0.5, "explore_p": None}}))
    args = MODEL_ARGS + ["--speculative-draft-model-path", qwen05_draft_path, "--speculative-adaptive-config", str(config)]
    with leak_checked_server(qwen05_path, args, tmp_path / "server.log", env=TWIN_ENV) as server:
        report = _check(server, prompts, plain_ids, "draft model")
        assert_every_step_replayed_a_tier(server, static_shape=True, widths=2)
    draft = report["cost_model"]["draft"]  # the draft model's per-step cost, measured too
    assert draft["observed_steps"] > 0 and len(draft["probe_ms"]) > 1, draft
    # Plain steps and prefills deferred their draft-extend and drafting steps caught up (extend_backlog.py):
    # the parity above covers both paths, at batch sizes 1..8, with new requests joining.
    backlog = report["draft_extend"]
    assert backlog["deferred_steps"] > 0 and backlog["catch_up_forwards"] > 0, backlog
    assert backlog["deferred_prefills"] > 0, backlog  # prompts too: the draft extends them on demand
    # The draft's second choices rode along in verify rows the cost model found free, so the
    # parity covers them too (`pick_runner_ups`; at 1-8 rows a CPU forward costs alike).
    assert report["runner_ups"]["verified"] > 0, report["runner_ups"]


def _acceptance(results: list[dict]) -> float:
    """Accepted draft tokens per draft token proposed, over every request."""
    accepted = proposed = 0.0
    for r in results:
        info = r["meta_info"]
        accepted += info.get("spec_num_correct_drafts", 0)
        proposed += info.get("spec_cap_length", 0.0) * info.get("spec_verify_ct", 0)
    assert proposed > 0, "nothing was drafted"
    return accepted / proposed


@pytest.mark.long  # an acceptance measurement: two servers, 24 prompts each
def test_deferred_draft_extend_keeps_the_drafts_as_good(smollm2_path, tmp_path):
    # SmolLM2 drafting for itself: with the draft's KV right, most drafts are the target's own
    # greedy tokens. Not all: SGLang's standalone draft reads its input one token ahead
    # (eagle_worker_v2.py:990-996), so the draft never sees the prompt's first token; with
    # transformers, float32, that alone makes SmolLM2's next token differ from its own greedy
    # one at a few percent of answer positions, so with a 2-token chain, and drafts past the
    # token cap counted as proposed, clearly fewer than all are accepted. A min_token_prob no
    # estimate reaches keeps the policy to plain steps (deferring the extend) except when it
    # explores, right after a catch-up. A catch-up that left the KV wrong would stay lossless
    # (verify rejects) but sink acceptance: compare with extending on every step.
    prompts = parity_prompts(load_tokenizer(smollm2_path))[:24]
    args = MODEL_ARGS + ["--speculative-draft-model-path", smollm2_path]
    rates, backlogs = {}, {}
    for defer in (True, False):
        path = tmp_path / f"adaptive-{defer}.json"
        # A model drafting for itself never pays on a CPU: explore on schedule all the same.
        own = {"defer_draft_extend": defer, "explore_share": 0.5, "min_token_prob": 0.99, "explore_p": None}
        # Exploring drafts 2 tokens: both from the draft model's chain, none from the context.
        path.write_text(json.dumps({"1": {"candidate_steps": [0, 2]}, "specsot": own}))
        with ServerProcess(smollm2_path, args + ["--speculative-adaptive-config", str(path)]) as server:
            # The prompts' common prefix (the chat template's system prompt) prefilled alone
            # and finished at once: the radix cache holds it without the draft's KV, so the
            # first batch is behind over the same slots and its catch-up extends them once.
            generate(server, [os.path.commonprefix(prompts)], 1)
            results = generate(server, prompts[:4], MAX_NEW) + run_batches(server, prompts[4:], MAX_NEW)
            rates[defer] = _acceptance(results)
            backlogs[defer] = server.get("/server_info")["internal_states"][0]["specsot"].get("draft_extend")
    print(f"draft acceptance: deferred draft-extend {rates[True]:.3f}, every step {rates[False]:.3f}; {backlogs[True]}")
    assert backlogs[False] is None, backlogs  # the key turns the backlog off
    assert backlogs[True]["deferred_steps"] > 100 and backlogs[True]["catch_up_forwards"] > 5, backlogs
    # Prompts' draft-extends were deferred too, and the prompts share the chat template's
    # system prompt through the radix cache: a catch-up that trusted a shared prefix the
    # draft never extended would sink the acceptance below.
    assert backlogs[True]["deferred_prefills"] >= len(prompts), backlogs
    assert backlogs[True]["shared_rows"] > 0, backlogs  # ... and one catch-up extended it for the batch
    # The tokens each exploring step's chain fed and verify accepted kept the draft KV that
    # chain wrote; the catch-ups after extended only the rest (drafters/model_extend.DeferredExtend.draft_extend). KV
    # reused at the wrong positions would sink the acceptance below as well.
    assert backlogs[True]["reused_rows"] > 0, backlogs
    assert rates[False] >= 0.6, f"a model drafting for itself accepted only {rates[False]:.2f}: the check is void"
    # Wrong KV would leave the drafts mostly rejected; run-to-run noise is a few hundredths.
    assert rates[True] >= max(0.6, rates[False] - 0.1), f"acceptance with deferred draft-extends {rates[True]:.2f}, without {rates[False]:.2f}"
