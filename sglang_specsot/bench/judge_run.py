"""The judge pass: one judge server, every pending (SoT, plain) pair, appended as it goes."""

from __future__ import annotations

import sys
from pathlib import Path

from sglang_specsot.bench.judge import judge_pair, load_judgements, pending, record
from sglang_specsot.bench.store import CELLS_FILE, load

JUDGE_ARGS = ["--device", "cpu", "--attention-backend", "specsot_cpu", "--dtype", "bfloat16",
              "--max-total-tokens", "8192", "--sleep-on-idle", "--mem-fraction-static", "0.6"]  # fmt: skip


def run_judge(out: Path, judge_model: str, configs: list[str], timeout: float) -> int:
    from tqdm import tqdm

    from sglang_specsot.bench.e2e import resolve_model
    from sglang_specsot.data import load_questions
    from sglang_specsot.frontend import chat_renderer
    from sglang_specsot.launch import ServerProcess

    if not (out / CELLS_FILE).exists():
        raise ValueError(f"{out} has no {CELLS_FILE}; run e2e first")
    cells = load(out / CELLS_FILE)
    todo = pending(cells, configs, load_judgements(out))
    if not todo:
        return 0
    import json

    settings = json.loads((out / "run.json").read_text())
    texts = {int(r.get("id", i)): r["question"] for i, r in enumerate(load_questions(settings["questions"]), 1)}
    path = resolve_model(judge_model, "judge-model")
    render = chat_renderer(path)
    (out / "logs").mkdir(exist_ok=True)
    with ServerProcess(path, JUDGE_ARGS, log_path=out / "logs" / "judge.log") as server:
        for cell, base in tqdm(todo, desc="judge", file=sys.stderr):
            if cell.answer == base.answer:
                record(out, cell, ("tie", "tie"))
                continue
            record(out, cell, judge_pair(server.base_url, render, texts[cell.question_id], cell.answer, base.answer, timeout))
    return len(todo)
