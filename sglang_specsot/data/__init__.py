"""Question sets shipped inside the package (provenance and licences in data/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
QUESTION_SETS = {"vicuna80": DATA_DIR / "vicuna80.jsonl"}


def question_set_path(name_or_path: str | Path) -> Path:
    """The file of a named question set, or `name_or_path` itself when it is a file."""
    if str(name_or_path) in QUESTION_SETS:
        return QUESTION_SETS[str(name_or_path)]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"unknown question set {str(name_or_path)!r}: name one of {sorted(QUESTION_SETS)} "
            "or give the path of a .jsonl file with a 'question' field on every line"
        )
    return path


def load_questions(name_or_path: str | Path = "vicuna80") -> list[dict]:
    """The rows of a question set; every row has at least a non-empty string "question"."""
    path = question_set_path(name_or_path)
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not row["question"].strip():
            raise ValueError(f"{path}:{number}: every line needs a non-empty string 'question'")
        rows.append(row)
    return rows
