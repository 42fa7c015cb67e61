"""The skeleton constraint on real CPU servers (SmolLM2-135M, float32, greedy).

Proves: skeletons generated under the constraint parse as plans within the bounds and end
cleanly; a SPECSOT server, whose verify applies custom logit processors, gives exactly the
plain server's constrained output, where the constraint binds at decode steps (which SPECSOT
only ever samples at verify); the frontend program picks the constraint up on its own.
"""

from __future__ import annotations

import pytest

from sglang_specsot.bench.cells import flush_cache
from sglang_specsot.launch import ServerProcess
from sglang_specsot.serving.skeleton_constraint import skeleton_processor_for
from sglang_specsot.sot import SoTConfig, parse_skeleton, skeleton_prompt
from sglang_specsot.sot.runner import SoTOptions
from tests.integration.conftest import cpu_args, scheduler_loop_line
from tests.integration.parity import load_tokenizer

pytestmark = pytest.mark.integration

COMMON = cpu_args(mem_fraction_static=None) + ["--enable-custom-logit-processor"]
# SGLang's plain overlap scheduler samples before the previous token reaches req.output_ids
# (tp_worker.py:718-745), so a processor would read a history one token short; delayed
# sampling (SGLang's own switch) runs it after, which makes the plain server a true reference.
PLAIN_ENV = {"SGLANG_ENABLE_DELAY_SAMPLE": "1"}
QUESTIONS = ["How can I improve my time management skills?",
             "What are the benefits of learning a second language?",
             "How do I prepare for a job interview?"]  # fmt: skip
CONFIG = SoTConfig(max_points=3, max_point_words=4, max_point_chars=32, skeleton_max_tokens=48,
                   default_branch_tokens=16, min_branch_tokens=8, max_running=2,
                   router_min_answer_tokens=1)  # fmt: skip
MAX_NEW = 48


@pytest.fixture(scope="module")
def prompts(smollm2_path) -> list[str]:
    tokenizer = load_tokenizer(smollm2_path)
    render = lambda m: tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)  # noqa: E731
    return [skeleton_prompt(q).render(render) for q in QUESTIONS]  # each ends with the "1." pre-fill


def _generate(server, prompts, processor: str | None) -> list[dict]:
    body = {"text": prompts, "sampling_params": {
        "temperature": 0, "max_new_tokens": MAX_NEW,
        # Any dict: SGLang hands a processor the request ("__req__") only with custom_params.
        "custom_params": {"specsot": {"group": "constraint-test", "role": "skeleton"}},
    }}  # fmt: skip
    if processor is not None:
        body["custom_logit_processor"] = processor
    return server.post("/generate", body)


@pytest.fixture(scope="module")
def plain(smollm2_path, prompts) -> dict[str, list[dict]]:
    processor = skeleton_processor_for(smollm2_path, CONFIG)
    with ServerProcess(smollm2_path, COMMON, env=PLAIN_ENV) as server:
        return {"constrained": _generate(server, prompts, processor), "free": _generate(server, prompts, None)}


@pytest.fixture(scope="module")
def specsot(smollm2_path, prompts, plain, shared_specsot_server) -> dict:
    """The session's SPECSOT server (custom logit processors on, as COMMON has them), its KV
    cache and drafting corpus flushed so that nothing is reused from other modules' answers."""
    from sglang_specsot.frontend import SoTEndpoint, answer_question

    server = shared_specsot_server
    processor = skeleton_processor_for(smollm2_path, CONFIG)
    flush_cache(server.base_url, timeout=60)
    outputs = _generate(server, prompts, processor)
    answer = answer_question(SoTEndpoint(server.base_url), QUESTIONS[0], options=SoTOptions("on", CONFIG))
    return {"outputs": outputs, "answer": answer, "log": server.log_path.read_text()}


def test_constrained_skeletons_are_plans_within_bounds_that_end_cleanly(plain):
    for out in plain["constrained"]:
        parse = parse_skeleton(out["text"], CONFIG, prefill="1.")
        assert parse.is_plan, (out["text"], parse)
        assert 2 <= len(parse.points) <= CONFIG.max_points and parse.long_points == ()
        # The one repair allowed: a point repeated once it could not grow (not counted).
        assert all(note.startswith("dropped duplicate") for note in parse.notes), parse.notes
        assert all(len(p.text.split()) <= CONFIG.max_point_words for p in parse.points)
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out  # the end of turn


def test_the_constraint_binds_after_the_first_token(plain):
    # Else parity below would hold even if verify ignored the processor: SPECSOT samples the
    # first token at prefill with SGLang's own sampler and every later one at verify.
    diverge = []
    for constrained, free in zip(plain["constrained"], plain["free"]):
        a, b = constrained["output_ids"], free["output_ids"]
        if a != b:
            diverge.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
    assert diverge and max(diverge) >= 1, diverge


def test_specsot_gives_the_plain_constrained_output(plain, specsot):
    got = [o["output_ids"] for o in specsot["outputs"]]
    want = [o["output_ids"] for o in plain["constrained"]]
    assert got == want
    assert scheduler_loop_line(overlap=True) in specsot["log"]


def test_the_frontend_program_constrains_its_skeleton_on_its_own(specsot):
    answer = specsot["answer"]
    assert answer.skeleton.request.logit_processor is not None  # found via /server_info
    parse = answer.skeleton.parse
    assert parse.is_plan and 2 <= len(parse.points) <= CONFIG.max_points
    assert all(len(p.text.split()) <= CONFIG.max_point_words for p in parse.points)
    assert answer.path == "sot" and len(answer.branches.results) == len(parse.points)
