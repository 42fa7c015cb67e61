"""The judge pass: one judge server, every pending (SoT, plain) pair, appended as it goes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sglang_specsot.bench.judge import Reply, judge_pair, load_judgements, pending, record
from sglang_specsot.bench.store import CELLS_FILE, RUN_FILE, load

JUDGE_ARGS = ["--device", "cpu", "--attention-backend", "specsot_cpu", "--dtype", "bfloat16",
              "--max-total-tokens", "8192", "--sleep-on-idle", "--mem-fraction-static", "0.9"]  # fmt: skip
SAME = (Reply("tie", None), Reply("tie", None))  # identical answers need no judge


def choice_ids(model_path: str) -> tuple[int, int]:
    """The token ids of "A" and "B" in the judge's vocabulary (each must be one token)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    ids = [tok.encode(word, add_special_tokens=False) for word in ("A", "B")]
    assert all(len(i) == 1 for i in ids), f"'A'/'B' are not single tokens for {model_path}: {ids}"
    return ids[0][0], ids[1][0]


def run_judge(out: Path, judge_model: str, configs: list[str], timeout: float) -> int:
    from tqdm import tqdm

    from sglang_specsot.bench.e2e import resolve_model
    from sglang_specsot.data import load_questions
    from sglang_specsot.frontend import chat_renderer
    from sglang_specsot.launch import ServerProcess

    if not (out / CELLS_FILE).exists():
        raise ValueError(f"{out} has no {CELLS_FILE}; run e2e first")
    cells = load(out / CELLS_FILE)
    # Pairs judged without the calibrated verdict (judge.jsonl rows lacking it) are judged again.
    todo = pending(cells, configs, load_judgements(out, "calibrated"))
    if not todo:
        return 0
    settings = json.loads((out / RUN_FILE).read_text())
    texts = {int(r.get("id", i)): r["question"] for i, r in enumerate(load_questions(settings["questions"]), 1)}
    path = resolve_model(judge_model, "judge-model")
    render, ids = chat_renderer(path), choice_ids(path)
    (out / "logs").mkdir(exist_ok=True)
    with ServerProcess(path, JUDGE_ARGS, log_path=out / "logs" / "judge.log") as server:
        for cell, base in tqdm(todo, desc="judge", file=sys.stderr):
            if cell.answer == base.answer:
                record(out, cell, SAME)
                continue
            question = texts[cell.question_id]
            record(out, cell, judge_pair(server.base_url, render, ids, question, cell.answer, base.answer, timeout))
    return len(todo)
