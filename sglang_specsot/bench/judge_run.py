"""The judge pass: one judge server, every pending (SoT, plain) pair, appended as it goes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sglang_specsot.bench.judge import JUDGE_FILE, Reply, judge_pair, load_judgements, pending, record
from sglang_specsot.bench.judge_controls import CONTROLS_FILE, NormalAnswer
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


def normal_answers(out: Path) -> list[NormalAnswer]:
    """The normal answer of every suitable question a run answered plainly, with how it ended
    (controls are built only from the sound ones: judge_controls.sound_answers)."""
    from sglang_specsot.bench.configs import BASELINE
    from sglang_specsot.bench.store import OK

    cells, texts = load(out / CELLS_FILE), _question_texts(out)
    return [NormalAnswer(qid, texts[qid], c.answer, c.finish_reason, c.looped) for (qid, name), c in sorted(cells.items())
            if name == BASELINE and c.status == OK and c.suitable and c.answer.strip()]  # fmt: skip


def real_pairs(out: Path, configs: list[str], judged: dict | None = None) -> list[tuple[int, str, str, str, str]]:
    """(question_id, config, question, SoT answer, normal answer) of every pair not in `judged`
    whose answers differ."""
    cells, texts = load(out / CELLS_FILE), _question_texts(out)
    return [(c.question_id, c.config, texts[c.question_id], c.answer, base.answer)
            for c, base in pending(cells, configs, judged or {}) if c.answer != base.answer]  # fmt: skip


def _question_texts(out: Path) -> dict[int, str]:
    from sglang_specsot.data import load_questions

    settings = json.loads((out / RUN_FILE).read_text())
    return {int(r.get("id", i)): r["question"] for i, r in enumerate(load_questions(settings["questions"]), 1)}


def run_controls(judge, judge_name: str, normals: list[NormalAnswer], reals: list, dest: Path, seed: int = 0,
                 recorded: list | None = None) -> dict:  # fmt: skip
    """Ask `judge` every control pair of `normals` (the sound ones) and every real pair of
    `reals` in both orders; `recorded` real pairs' words (question_id, config, SoT-first word,
    normal-first word) join those asked. The record (dest/judge_controls.json) is written after
    each asking, so a stopped run keeps its part."""
    from tqdm import tqdm

    from sglang_specsot.bench import judge_controls as jc

    dest.mkdir(parents=True, exist_ok=True)
    controls: list = []
    real: list = list(recorded or [])
    sound, excluded = jc.sound_answers(normals)
    write = lambda: write_controls_record(judge_name, seed, controls, real, dest, len(sound), excluded)  # noqa: E731
    record = write()
    for pair in tqdm(jc.control_pairs(normals, seed), desc="controls", file=sys.stderr):
        for real_first in (True, False):
            controls.append(jc.ask_control(judge, pair, real_first))
            record = write()
    for qid, config, question, sot, normal in tqdm(reals, desc="real pairs", file=sys.stderr):
        first = judge(question, sot, normal)
        real.append((qid, config, first, judge(question, normal, sot)))
        record = write()
    return record


def recorded_real_pairs(out: Path, configs: list[str]) -> list[tuple[int, str, str | None, str | None]]:
    """(question_id, config, SoT-first word, normal-first word) of the real pairs a run's judge.jsonl
    holds for `configs`, leaving out pairs whose answers are identical (never asked)."""
    cells = load(out / CELLS_FILE)
    same = {c.key for c, base in pending(cells, configs, {}) if c.answer == base.answer}
    rows = [json.loads(line) for line in (out / JUDGE_FILE).read_text().splitlines() if line.strip()]
    return [(r["question_id"], r["config"], r["sot_first"], r["normal_first"]) for r in rows
            if r["config"] in configs and (r["question_id"], r["config"]) not in same]  # fmt: skip


def write_controls_record(judge_name: str, seed: int, controls: list, real: list, dest: Path, sound: int,
                          excluded: dict[int, str]) -> dict:  # fmt: skip
    """Write dest/judge_controls.json: the judge's ControlScore and line, every control verdict,
    every real pair's (question_id, config, SoT-first word, normal-first word), and how many
    normal answers were sound enough to build controls and why the others were not."""
    from dataclasses import asdict

    from sglang_specsot.bench import judge_controls as jc

    result = jc.score(controls, [(a, b) for _, _, a, b in real])
    record = {"judge": judge_name, "seed": seed, "score": asdict(result), "passes": result.passes,
              "line": jc.describe(judge_name, result), "by_kind": jc.by_kind(controls),
              "sound_answers": sound, "excluded": {str(q): why for q, why in sorted(excluded.items())},
              "controls": [asdict(v) for v in controls],
              "real": [{"question_id": q, "config": c, "sot_first": a, "normal_first": b} for q, c, a, b in real]}  # fmt: skip
    (dest / CONTROLS_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return record


def judge_by_url(out: Path, judge, judge_name: str, configs: list[str]) -> str:
    """The judge pass through an endpoint: its controls on this run's normal answers and every
    real pair in both orders (all of them, so the record is this judge's alone); the pairs not
    yet in judge.jsonl are appended to it. Returns the judge's control line."""
    cells = load(out / CELLS_FILE)
    todo = pending(cells, configs, load_judgements(out))
    same = [(c, base) for c, base in todo if c.answer == base.answer]
    for cell, _ in same:
        record(out, cell, SAME)
    reals = real_pairs(out, configs)
    result = run_controls(judge, judge_name, normal_answers(out), reals, out)
    by_key = {(r["question_id"], r["config"]): r for r in result["real"]}
    for cell, base in todo:
        if cell.answer != base.answer and cell.key in by_key:
            row = by_key[cell.key]
            record(out, cell, (Reply(row["sot_first"], None), Reply(row["normal_first"], None)))
    return result["line"]


def controls_cli(out: Path, dest: Path, args, make_judge) -> str:
    """`judge-controls`: the controls (and real pairs) of a run, by an endpoint or a served model;
    with --recorded-real, the real pairs' words come from the run's judge.jsonl instead. Returns
    which answers built controls and the judge's control line."""
    from sglang_specsot.bench.judge_controls import describe_sound, sound_answers

    configs = args.configs.split(",")
    normals = normal_answers(out)[: args.questions]
    recorded = recorded_real_pairs(out, configs) if args.recorded_real else None
    reals = [] if args.recorded_real else real_pairs(out, configs)[: args.real]
    name = args.judge_name or args.judge_url or args.judge_model
    sound, excluded = sound_answers(normals)
    head = describe_sound(len(sound), excluded) + "\n"
    if args.judge_url or not (normals or reals):  # nothing to ask: no server to start
        return head + run_controls(make_judge(args), name, normals, reals, dest, args.seed, recorded)["line"]
    from dataclasses import replace

    from sglang_specsot.bench.e2e import resolve_model
    from sglang_specsot.launch import ServerProcess

    path = resolve_model(args.judge_model, "judge-model")
    (dest / "logs").mkdir(parents=True, exist_ok=True)
    with ServerProcess(path, JUDGE_ARGS, log_path=dest / "logs" / "judge.log") as server:
        judge = replace(make_judge(args), url=server.base_url)
        return head + run_controls(judge, name, normals, reals, dest, args.seed, recorded)["line"]
