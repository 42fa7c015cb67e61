"""examples/remerge_answers.py: recorded answers merged again as the merge now does."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[3] / "examples" / "remerge_answers.py"
_spec = importlib.util.spec_from_file_location("remerge_answers", _PATH)
rm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rm)

QUESTION = "How can I improve my time management skills?"
RECORDED = (
    "Intro line:\n"
    "1. **Prioritize tasks**: Prioritizing tasks is crucial for managing time effectively. It helps you focus.\n"
    "2. **Nationalism**: is a feeling of pride.\n"
    "3. **Take breaks**: Short breaks restore focus."
)


def test_a_recorded_answer_reads_as_todays_merge_writes_it():
    assert rm.remerge_answer(RECORDED, QUESTION).splitlines() == [
        "Intro line:",
        "1. **Prioritize tasks**: It helps you focus.",
        "2. **Nationalism** is a feeling of pride.",
        "3. **Take breaks**: Short breaks restore focus.",
    ]


def test_a_run_is_copied_with_only_its_sot_answers_merged_again(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "questions.jsonl").write_text(json.dumps({"id": 3, "question": QUESTION}) + "\n")
    cells = [{"question_id": 3, "config": "SoT-server", "path": "sot", "answer": RECORDED},
             {"question_id": 3, "config": "plain", "path": "normal", "answer": RECORDED}]  # fmt: skip
    (run / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    (run / "COMMAND").write_text("how it ran")
    assert rm.remerge_run(run, tmp_path / "out") == 1
    sot, plain = map(json.loads, (tmp_path / "out" / "cells.jsonl").read_text().splitlines())
    assert "crucial" not in sot["answer"] and plain["answer"] == RECORDED
    assert (tmp_path / "out" / "COMMAND").read_text() == "how it ran"
    with pytest.raises(ValueError, match="is RUN_DIR"):
        rm.remerge_run(run, run)
