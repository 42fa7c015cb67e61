"""The greedy-parity workload shared by the SPECSOT server tests: 36 prompts, batch sizes 1..8."""

from __future__ import annotations

import functools

from sglang_specsot.data import load_questions
from sglang_specsot.sot import expansion_prompt

BATCH_SIZES = [1, 2, 3, 4, 5, 6, 7, 8]  # cycled over the prompt list: every size appears
POINTS = ["Set clear goals", "Prioritize tasks", "Avoid distractions", "Take short breaks"]


def chunks(items: list, sizes: list[int] = BATCH_SIZES) -> list[list]:
    """`items` cut into consecutive batches whose sizes cycle through `sizes`."""
    out, i, k = [], 0, 0
    while i < len(items):
        out.append(items[i : i + sizes[k % len(sizes)]])
        i, k = i + sizes[k % len(sizes)], k + 1
    return out


# 28 Vicuna questions and the 8 branch prompts: 36 prompts, every batch size 1..8 once (8 batches).
PARITY_QUESTIONS = 28
# The static-shape twins' parity: the first six batches (sizes 1..6, 21 questions), every captured
# batch size (1, 2, 4, 8) met or padded to; the servers a CPU user runs decode all 36 prompts.
TWIN_PROMPTS = 21
assert sum(BATCH_SIZES[:6]) == TWIN_PROMPTS


@functools.lru_cache(maxsize=None)
def load_tokenizer(model_path: str):
    """`model_path`'s tokenizer, loaded once per process (every module of a model shares it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def parity_prompts(tokenizer, questions: int = PARITY_QUESTIONS) -> list[str]:
    """The first `questions` Vicuna questions and 8 SoT branch prompts (the shape SoT sends), in
    `tokenizer`'s chat format. 28 questions make 36 prompts: every batch size once."""
    chat = lambda m: tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)  # noqa: E731
    questions = [row["question"] for row in load_questions("vicuna80")][:questions]
    plain = [chat([{"role": "user", "content": q}]) for q in questions]
    branch = [expansion_prompt(q, POINTS, i % len(POINTS)).render(chat) for i, q in enumerate(questions[:8])]
    return plain + branch


def generate(server, texts: list[str], max_new: int, custom_params: dict | None = None) -> list[dict]:
    """Greedy `/generate` of one batch; always a list of results."""
    sampling = {"temperature": 0, "max_new_tokens": max_new}
    if custom_params is not None:
        sampling["custom_params"] = custom_params
    out = server.post("/generate", {"text": texts, "sampling_params": sampling})
    return out if isinstance(out, list) else [out]


def mismatches(results: list[dict], expected_ids: list[list[int]]) -> list[int]:
    """Indices of the prompts whose output ids differ from `expected_ids`."""
    return [i for i, (r, ids) in enumerate(zip(results, expected_ids)) if r["output_ids"] != ids]


def run_batches(server, prompts: list[str], max_new: int) -> list[dict]:
    return [r for chunk in chunks(prompts) for r in generate(server, chunk, max_new)]


def plain_reference(
    model_path: str, args: list[str], max_new: int, questions: int = PARITY_QUESTIONS
) -> tuple[list[str], list[list[int]]]:
    """The parity prompts in `model_path`'s chat format, and a plain server's greedy ids for them."""
    from sglang_specsot.launch import ServerProcess

    with ServerProcess(model_path, args) as server:
        return plain_reference_on(server, model_path, max_new, questions)


def plain_reference_on(
    server, model_path: str, max_new: int, questions: int = PARITY_QUESTIONS
) -> tuple[list[str], list[list[int]]]:
    """The same on a plain server already running, its KV cache flushed first, so its prefills
    share with nothing earlier requests left (as a fresh server's, and the SPECSOT servers')."""
    from sglang_specsot.bench.cells import flush_cache

    prompts = parity_prompts(load_tokenizer(model_path), questions)
    flush_cache(server.base_url, timeout=60)
    return prompts, [r["output_ids"] for r in run_batches(server, prompts, max_new)]
