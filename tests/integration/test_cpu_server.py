"""Real SGLang servers on this CPU: the plugin loads everywhere, plain decoding serves, and
SGLang's own NGRAM and STANDALONE are token-identical to plain decoding (float32, greedy).
"""

from __future__ import annotations

import json

import pytest

from sglang_specsot.bench.cells import flush_cache
from sglang_specsot.launch import ServerProcess
from tests.integration.conftest import cpu_args
from tests.integration.parity import load_tokenizer

pytestmark = pytest.mark.integration

COMMON = cpu_args()
MAX_NEW = 40

# Ten prompts, some repetitive so that n-gram drafting has something to match.
PROMPTS = [
    "List the days of the week, separated by commas: Monday, Tuesday,",
    "Count from one to twenty in words: one, two, three, four,",
    "Repeat after me three times: the cat sat on the mat. The cat sat on the mat.",
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain why the sky is blue in two sentences.",
    "Give three tips for better sleep.",
    "The alphabet goes A B C D E F G H I J K",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "How can I improve my time management skills?",
]


def _chat_prompt(tokenizer_dir: str, question: str) -> str:
    tok = load_tokenizer(tokenizer_dir)  # one load per process, not one per prompt
    return tok.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )


def _generate(server: ServerProcess, texts: list[str]) -> list[dict]:
    """One /generate call with a list of prompts: SGLang batches them."""
    out = server.post(
        "/generate",
        {"text": texts, "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW}},
    )
    return out if isinstance(out, list) else [out]


def _run_batches(server: ServerProcess, prompts: list[str], batch_size: int) -> list[dict]:
    results: list[dict] = []
    for i in range(0, len(prompts), batch_size):
        results.extend(_generate(server, prompts[i : i + batch_size]))
    return results


def _token_ids(results: list[dict]) -> list[list[int]]:
    return [r["output_ids"] for r in results]


@pytest.fixture(scope="module")
def chat_prompts(smollm2_path) -> list[str]:
    return [_chat_prompt(smollm2_path, p) for p in PROMPTS]


@pytest.fixture(scope="module")
def plain_server(smollm2_server):
    """The session's plain SmolLM2 server (COMMON's arguments, debug logging and the plugin's
    trace besides), its KV cache flushed: batch 1 and batch 4 below start from the same state."""
    flush_cache(smollm2_server.base_url, timeout=60)
    return smollm2_server


@pytest.fixture(scope="module")
def plain_outputs(plain_server, chat_prompts) -> dict[int, list[list[int]]]:
    return {bs: _token_ids(_run_batches(plain_server, chat_prompts, bs)) for bs in (1, 4)}


def test_plugin_loaded_in_every_sglang_process(plain_server):
    records = [json.loads(line) for line in plain_server.trace_path.read_text().splitlines()]
    callers = {r["caller"] for r in records}
    assert {r["error"] for r in records} == {None}, records
    assert len({r["pid"] for r in records}) >= 3, records
    assert any(c.endswith("launch_server.py") for c in callers), callers
    assert any(c.endswith("managers/scheduler.py") for c in callers), callers
    assert any(c.endswith("managers/detokenizer_manager.py") for c in callers), callers
    # The scheduler runs the model, so it must be on our torch ops (no CPU sgl_kernel here).
    scheduler = [r for r in records if r["caller"].endswith("managers/scheduler.py")]
    assert all(r["sgl_kernel_shim"] for r in scheduler), scheduler
    assert all(r["host_changes"] for r in scheduler), scheduler


def test_plain_generate_and_chat(plain_server, chat_prompts):
    out = _generate(plain_server, chat_prompts[3:4])[0]
    assert "paris" in out["text"].lower(), out["text"]
    assert out["meta_info"]["completion_tokens"] > 0

    chat = plain_server.post(
        "/v1/chat/completions",
        {
            "model": "default",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0,
            "max_tokens": MAX_NEW,
        },
    )
    answer = chat["choices"][0]["message"]["content"]
    assert "paris" in answer.lower(), answer
    # The chat route applies the same template, so it must say what /generate said.
    assert answer.strip() == out["text"].strip()
    assert chat["usage"]["completion_tokens"] == out["meta_info"]["completion_tokens"]


def test_plain_batch_equals_single(plain_outputs):
    # Batching must not change greedy output in float32, or the parity tests prove nothing.
    assert plain_outputs[1] == plain_outputs[4]


SPEC_CONFIGS = {
    "NGRAM": ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "6"],
    # SmolLM2 has no smaller partner with its tokenizer; drafting with itself is an honest
    # parity check (every draft is then the target's own greedy choice: accept length high).
    "STANDALONE": ["--speculative-algorithm", "STANDALONE", "--speculative-num-steps", "3",
                   "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],  # fmt: skip
}


@pytest.mark.long  # SGLang's own algorithms; SPECSOT's parity is in the default tier
@pytest.mark.parametrize("algo", sorted(SPEC_CONFIGS))
def test_builtin_speculative_is_token_identical(algo, smollm2_path, chat_prompts, plain_outputs):
    args = COMMON + SPEC_CONFIGS[algo]
    if algo == "STANDALONE":
        args += ["--speculative-draft-model-path", smollm2_path]
    with ServerProcess(smollm2_path, args) as server:
        for bs in (1, 4):
            results = _run_batches(server, chat_prompts, bs)
            got = _token_ids(results)
            mismatches = [i for i, (a, b) in enumerate(zip(got, plain_outputs[bs])) if a != b]
            assert not mismatches, f"{algo} bs={bs} differs from plain decoding on prompts {mismatches}"
            accept = [r["meta_info"].get("spec_accept_length", 0.0) for r in results]
            assert max(accept) > 1.0, f"{algo} bs={bs} accepted no draft token: {accept}"
        server_accept = server.get("/server_info")["internal_states"][0]["avg_spec_accept_length"]
        assert server_accept > 1.0, server_accept


def test_frontend_fork_join(plain_server):
    import sglang as sgl

    @sgl.function
    def three_tips(s, topic):
        s += sgl.user(f"Give one short tip about {topic}.")
        s += sgl.assistant_begin()
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"Tip {i + 1}:" + sgl.gen("tip", max_tokens=16, temperature=0)
        forks.join()

    backend = sgl.RuntimeEndpoint(plain_server.base_url)
    state = three_tips.run(topic="sleep", backend=backend)
    tips = state["tip"]
    assert isinstance(tips, list) and len(tips) == 3, tips
    assert all(isinstance(t, str) and t.strip() for t in tips), tips
    # Each branch continued its own prefix, so the branches are not one request repeated.
    assert len(set(tips)) > 1, tips
