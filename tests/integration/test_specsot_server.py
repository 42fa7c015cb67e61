"""A real SPECSOT server on this CPU (SmolLM2-135M, float32, SoT-context drafting only).

Proves: greedy output token-identical to plain decoding on 36 prompts at batch sizes 1..8 (the
static-shape twin's: the first 21, batch sizes 1..6).
Default tier, two servers: what a CPU user runs (overlap on, launched without
`--attention-backend`, so the plugin chooses specsot_cpu and says so; no environment: the CPU's
QLEN_ONLY layout, eager, and SPECSOT's cost-aware policy choosing each step's draft budget from
0 to the window's), and the CUDA path's CPU twin (overlap off, the GPU's FULL layout through the
static-shape twin), drafting its whole window every step (SGLANG_SPECSOT_FIXED_WINDOW=1) so that
verify runs on every step. Long tier: the other two pairs, fixed window. The overlap event loop really drives the worker;
sibling branches of one SoT group draft from each other; malformed SoT metadata is served;
after each server's requests, SGLang's strict idle memory check ran and found no leak.
"""

from __future__ import annotations

import pytest
from tests.integration.conftest import (
    FIX,
    FIXED_WINDOW_ENV,
    SMOLLM2_PARITY_TOKENS,
    SPECSOT,
    assert_every_step_replayed_a_tier,
    cpu_args,
    leak_checked_server,
    scheduler_loop_line,
    without_backend,
)
from sglang_specsot.speculative.static_shape import STATIC_SHAPE_ENV
from sglang_specsot.speculative.tree_masks import LAYOUT_ENV
from tests.integration.parity import TWIN_PROMPTS, generate, load_tokenizer, mismatches, run_batches

pytestmark = pytest.mark.integration

COMMON = cpu_args(max_total_tokens=8192)  # room for a batch of 8 parity prompts
MAX_NEW = SMOLLM2_PARITY_TOKENS  # compared with the session's plain run


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return load_tokenizer(smollm2_path)


def _chat(tokenizer, messages) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@pytest.fixture(scope="module")
def prompts(smollm2_parity) -> list[str]:
    return smollm2_parity[0]


def _generate(server, texts, custom_params=None) -> list[dict]:
    return generate(server, texts, MAX_NEW, custom_params)


def _run(server, prompts) -> list[dict]:
    return run_batches(server, prompts, MAX_NEW)


@pytest.fixture(scope="module")
def plain_ids(smollm2_parity) -> list[list[int]]:
    return smollm2_parity[1]  # plain decoding with COMMON, the same batches


# The default tier's two servers. The CPU user's: the overlap loop (SGLang's default), no
# `--attention-backend` (the plugin chooses specsot_cpu) and no layout or static-shape setting
# (the CPU's QLEN_ONLY layout, eager at every width: the defaults, checked in the log). The CUDA
# path's CPU twin, overlap off: it verifies with the GPU's FULL tree-mask layout (the CPU backend
# reads it by the Triton kernel's offsets and checks its prefix columns), every step padded to a
# verify tier and run through static buffers as a graph replay feeds them
# (speculative/static_shape.py). The other two pairs, each loop with each layout, are long.
SERVERS = [
    pytest.param(("overlap", "qlen_only", "no-backend-flag"), id="overlap-qlen_layout-no_backend_flag"),
    pytest.param(("no-overlap", "full", "specsot_cpu"), id="no-overlap-full_layout-static_shape"),
    pytest.param(("overlap", "full", "specsot_cpu"), id="overlap-full_layout-static_shape", marks=pytest.mark.long),
    pytest.param(("no-overlap", "qlen_only", "specsot_cpu"), id="no-overlap-qlen_layout", marks=pytest.mark.long),
]

# The servers that draft their whole window every step: what a drafter proposes shows in every
# step's accept length there, where the policy's server may weigh a step's draft as not worth it.
FIXED_WINDOW_SERVERS = [p for p in SERVERS if p.values[0][2] == "specsot_cpu"]


@pytest.fixture(scope="module", params=SERVERS)
def specsot_server(request, smollm2_path, tmp_path_factory):
    mode, layout, backend = request.param
    extra = [] if mode == "overlap" else ["--disable-overlap-schedule"]
    log = tmp_path_factory.mktemp("specsot") / "server.log"
    # The user's server sets nothing: the defaults (layout, eager, the policy) are checked instead.
    env = {}
    if backend == "specsot_cpu":
        env = FIXED_WINDOW_ENV | {LAYOUT_ENV: layout, STATIC_SHAPE_ENV: "1" if layout == "full" else "0"}
    common = without_backend(COMMON) if backend == "no-backend-flag" else COMMON
    # Its teardown, after every test on this server, proves the idle memory check passed.
    with leak_checked_server(smollm2_path, common + SPECSOT + extra, log, env=env) as server:
        server.mode, server.layout, server.backend = mode, layout, backend
        server.fixed_window = backend == "specsot_cpu"
        yield server


def test_greedy_parity_and_accept_length(specsot_server, prompts, plain_ids):
    n = TWIN_PROMPTS if specsot_server.layout == "full" else len(prompts)
    results = _run(specsot_server, prompts[:n])
    bad = mismatches(results, plain_ids[:n])
    assert not bad, f"SPECSOT ({specsot_server.mode}) differs from plain decoding on prompts {bad}"
    accept = specsot_server.get("/server_info")["internal_states"][0]["avg_spec_accept_length"]
    assert accept > 1.0, accept
    assert all("spec_accept_length" in r["meta_info"] for r in results)
    layout = specsot_server.layout.upper()
    log = specsot_server.log_path.read_text()
    assert f"SPECSOT verify tree mask layout: {layout}" in log
    # Launched without a backend, the plugin chose the one that verifies and said so.
    assert (f"no attention backend chosen, using {FIX}" in log) == (specsot_server.backend == "no-backend-flag")
    # Context trees vary in size step by step: the steps are padded to more than one tier.
    assert_every_step_replayed_a_tier(specsot_server, static_shape=layout == "FULL", widths=2)
    report = specsot_server.get("/server_info")["internal_states"][0]["specsot"]
    if specsot_server.fixed_window:
        assert report["budget_mode"] == "fixed", report
    else:  # no flag, no environment: the cost-aware policy decided, from steps it measured
        assert report["budget_mode"] == "adaptive" and report["adaptive"] is True, report
        assert report["last_plan"] is not None and report["cost_model"]["target"]["observed_steps"] > 0, report
        assert "SPECSOT adaptive draft budgets on" in log


def test_the_expected_scheduler_loop_drives_the_worker(specsot_server):
    log = specsot_server.log_path.read_text()
    assert scheduler_loop_line(specsot_server.mode == "overlap") in log


@pytest.mark.parametrize("specsot_server", FIXED_WINDOW_SERVERS, indirect=True)
def test_siblings_draft_from_each_other(specsot_server, tokenizer):
    # The same branch prompt twice, one after the other: in one SoT group the second copy
    # drafts from its sibling's finished text, so nearly every draft is accepted.
    prompt = _chat(tokenizer, [{"role": "user", "content": "Describe a quiet morning by the lake."}])

    def accept(group: str, point: int) -> float:
        tag = {"specsot": {"group": group, "role": "branch", "point": point, "n": 2}}
        return _generate(specsot_server, [prompt], tag)[0]["meta_info"]["spec_accept_length"]

    first = accept(f"g-{specsot_server.mode}", 0)
    sibling = accept(f"g-{specsot_server.mode}", 1)
    stranger = accept(f"h-{specsot_server.mode}", 0)
    assert sibling > 2.5 and sibling > first + 1.0, (first, sibling, stranger)
    # A request of another group drafts from the finished text too, through the shared
    # corpus of finished requests (as NGRAM's would); a live sibling's text reaching only
    # its own group is the unit test test_sibling_output_is_drafted_only_within_the_group.
    assert stranger > first + 1.0, (first, sibling, stranger)


def test_malformed_metadata_is_served_unchanged(specsot_server, prompts, plain_ids):
    bad = {"specsot": {"role": "branch", "group": 7, "point": 9, "n": 2}}
    got = _generate(specsot_server, prompts[:2], bad)
    assert [r["output_ids"] for r in got] == plain_ids[:2]
    assert "ignoring malformed SoT metadata" in specsot_server.log_path.read_text()


def test_requests_that_end_at_prefill_leave_nothing_in_the_drafter(specsot_server, prompts):
    # A prefix commit (max_new_tokens=0, what server-side SoT sends before its branches) and
    # a one-token answer never decode, so draft-extend never sees them leave.
    def kept() -> int:
        state = specsot_server.get("/server_info")["internal_states"][0]
        return state["specsot"]["memory"]["drafter"]["requests"]

    before = kept()
    tag = {"specsot": {"group": f"prefix-{specsot_server.mode}", "role": "branch", "point": 0, "n": 2}}
    for max_new in (0, 1, 0, 1):
        body = {"text": prompts[:3], "sampling_params": [{"max_new_tokens": max_new, "temperature": 0}] * 3}
        specsot_server.post("/generate", body)
    specsot_server.post("/generate", {"text": prompts[3], "sampling_params": {"max_new_tokens": 1, "custom_params": tag}})
    # Later forwards forget what ended before them; a decoded request is forgotten at the
    # next decode step, so the last of these two stays until another request decodes.
    _generate(specsot_server, prompts[4:5])
    _generate(specsot_server, prompts[5:6])
    # 12 ungrouped requests that ended at prefill keep nothing; the grouped one stays as its
    # siblings' context (bounded by finished_sibling_tokens), the last decoded one until later.
    assert kept() - before <= 2, (before, kept())
