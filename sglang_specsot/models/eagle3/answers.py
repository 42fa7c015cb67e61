"""Stage 1 of `train-eagle3`: the target's own greedy answers to the prompt set.

A head learns to predict what its target writes, so the training text is the target's own
output (EAGLE-3's recipe regenerates its data with the target). The answers come from a plain
SGLang server on this machine (batched, so far faster than one-at-a-time generation), as
token ids: `/generate` returns the ids the target chose, which re-tokenizing the text need not
give back. Rows are appended as they finish; a rerun skips the prompts (id and text) already answered.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sglang_specsot.models.eagle3.store import append_row, read_rows

logger = logging.getLogger(__name__)

SERVER_ARGS = ["--device", "cpu", "--attention-backend", "specsot_cpu", "--dtype", "bfloat16",
               "--max-total-tokens", "32768", "--mem-fraction-static", "0.9", "--sleep-on-idle"]  # fmt: skip


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The chat-templated prompt, ending where the assistant's answer starts."""
    messages = [{"role": "user", "content": prompt}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding in transformers 5


def generate(server, ids: list[int], max_tokens: int) -> dict:
    body = {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": max_tokens}}
    out = server.post("/generate", body, timeout=1800.0)
    return {"answer_ids": list(out["output_ids"]), "finish": (out["meta_info"].get("finish_reason") or {}).get("type")}


def write_answers(target: str, jobs: list[tuple[list[dict], Path]], max_tokens: int, concurrency: int,
                  log_path: Path) -> None:  # fmt: skip
    """For each (prompts, out) job, append `{id, prompt, split, prompt_ids, answer_ids, finish}`
    to `out` for every prompt not answered there (a prompt whose text changed is answered
    again). One server answers every job."""
    from transformers import AutoTokenizer

    from sglang_specsot.launch import ServerProcess

    todo = []
    for prompts, out in jobs:
        done = {(row["id"], row["prompt"]) for row in read_rows(out)}
        todo += [(p, out) for p in prompts if (p["id"], p["prompt"]) not in done]
    if not todo:
        return
    tokenizer = AutoTokenizer.from_pretrained(target)
    lock = threading.Lock()
    total = sum(len(prompts) for prompts, _ in jobs)
    logger.info("answers: %d of %d prompts left; starting a server on %s", len(todo), total, target)
    with ServerProcess(target, SERVER_ARGS, log_path=log_path, startup_timeout=900) as server:
        def one(job: tuple[dict, Path]) -> None:
            p, out = job
            ids = prompt_ids(tokenizer, p["prompt"])
            row = {"id": p["id"], "prompt": p["prompt"], "split": p["split"], "prompt_ids": ids, **generate(server, ids, max_tokens)}
            with lock:
                append_row(out, row)

        pool = ThreadPoolExecutor(concurrency)
        try:
            for i, _ in enumerate(pool.map(one, todo), 1):
                if i % 20 == 0 or i == len(todo):
                    logger.info("answers: %d / %d", i, len(todo))
        finally:
            # On Ctrl-C or an error: queued prompts are dropped, not run; the server stops
            # (leaving the context) and cuts the running ones short, whose rows are never written.
            pool.shutdown(wait=False, cancel_futures=True)
