"""SPECSOT with a draft model drafts the same after a radix-cache hit as on a fresh prompt.

SGLang's draft worker reads one token ahead (draft KV slot p holds token p + 1), so a prefix
reused on single-token radix keys hands the draft, at its last slot, the token that followed
the prefix in the request that cached it (speculative/radix_keys.py). The oracle: SmolLM2
drafting for itself in float32, int8 off, a pure chain (window = chain, no SoT-context nodes,
whose corpus of finished requests would differ between the two runs), so every draft is a
deterministic function of the tokens the draft's KV holds. Two chat prompts share the chat
template's system prompt and part ways at their questions, as SoT branches share their group's
prompt and part ways at their points. The second is answered alone on a flushed cache, and
again after the first cached the shared prefix: its per-step acceptance (SPECSOT's trace, by
rid) must be the same step for step, and the second run must really have reused the prefix.
Without the pair keys (the host change off), the second run accepts differently.

The fresh run is also what the offline teacher (bench/teacher_trace.py, whose traces the GPU
replay serves) says this draft accepts on this answer: SGLang's draft never sees the prompt's
first token, and the teacher must model that, step for step.
"""

from __future__ import annotations

import json

import pytest
from sglang_specsot.bench.cells import flush_cache
from sglang_specsot.bench.teacher_trace import TeacherDraft, chain_steps
from sglang_specsot.cpu.draft_int8 import DRAFT_INT8_ENV
from sglang_specsot.speculative.trace import ENV as TRACE_ENV
from tests.integration.conftest import FIXED_WINDOW_ENV, cpu_args, leak_checked_server
from tests.integration.parity import load_tokenizer, parity_prompts

pytestmark = pytest.mark.integration

MAX_NEW = 64
# A 3-step chain verified alone: 4 rows, root included.
STEPS = 3
CHAIN = ["--speculative-num-steps", str(STEPS), "--speculative-num-draft-tokens", str(STEPS + 1)]


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("cached-prefix")
    args = cpu_args(max_total_tokens=8192, mem_fraction_static=0.5) + [
        "--speculative-algorithm", "SPECSOT", "--speculative-draft-model-path", smollm2_path, *CHAIN,
    ]  # fmt: skip
    env = FIXED_WINDOW_ENV | {DRAFT_INT8_ENV: "off", TRACE_ENV: str(folder / "trace.jsonl")}
    with leak_checked_server(smollm2_path, args, folder / "server.log", env=env) as s:
        s.trace_path = folder / "trace.jsonl"
        yield s


def _prompts(model_path: str) -> list[list[int]]:
    """The token ids of the first two parity prompts (chat questions sharing a system prompt)."""
    tokenizer = load_tokenizer(model_path)
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in parity_prompts(tokenizer, 2)[:2]]


def _answer(server, ids: list[int], rid: str) -> dict:
    sampling = {"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True}
    return server.post("/generate", {"input_ids": ids, "rid": rid, "sampling_params": sampling})


def _accepted(server, rid: str) -> list[int]:
    lines = server.trace_path.read_text().splitlines()
    return [step["accepted"] for step in map(json.loads, lines) if step["rid"] == rid]


@pytest.fixture(scope="module")
def runs(server, smollm2_path) -> dict:
    """Prompt 1 alone on a flushed cache ("fresh"), then prompt 0 and prompt 1 again ("cached")."""
    first, second = _prompts(smollm2_path)
    flush_cache(server.base_url, timeout=60)
    fresh = _answer(server, second, "fresh")
    flush_cache(server.base_url, timeout=60)
    _answer(server, first, "first")
    cached = _answer(server, second, "cached")
    # SGLang flushes only an idle server: by then every step of "cached" is in the trace (its
    # last step's line may land after the response).
    flush_cache(server.base_url, timeout=60)
    return {"prompt": second, "fresh": fresh, "cached": cached,
            "fresh_steps": _accepted(server, "fresh"), "cached_steps": _accepted(server, "cached")}  # fmt: skip


def test_a_cached_prefix_drafts_as_a_fresh_prompt(runs):
    fresh, cached, steps = runs["fresh"], runs["cached"], runs["fresh_steps"]
    assert fresh["meta_info"]["cached_tokens"] == 0, fresh["meta_info"]
    assert cached["meta_info"]["cached_tokens"] > 10, "the second prompt did not reuse the shared system prompt"
    assert cached["output_ids"] == fresh["output_ids"]
    assert steps and sum(steps) > MAX_NEW / 2, f"a model drafting for itself accepted little: {steps}"
    cached_steps = runs["cached_steps"]
    assert cached_steps == steps, f"drafts accepted per step, fresh {steps}, after the shared prompt {cached_steps}"


def test_the_offline_teacher_accepts_what_the_server_did(runs, smollm2_path):
    answer, served = runs["fresh"]["output_ids"], runs["fresh_steps"]
    teacher = TeacherDraft(smollm2_path, smollm2_path)
    offline = [s.accepted for s in chain_steps("r", answer, teacher.next_tokens(runs["prompt"], answer), STEPS)]
    # The last step may be cut by max_new_tokens on the server, not offline.
    assert offline[:-1] == served[: len(offline) - 1], f"teacher {offline}, served {served}"
