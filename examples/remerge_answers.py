"""Merge recorded SoT answers again as today's merge does, to read and judge them as it writes them.

    python examples/remerge_answers.py RUN_DIR OUT_DIR
    python -m sglang_specsot.bench report OUT_DIR          # what a reader sees, today's merge
    python -m sglang_specsot.bench blind-packets OUT_DIR --configs SoT-server --out PK --readers 4

A `bench e2e` folder keeps each answer's merged text, not its branches' raw text, so this works on
each point's first line ("N. **Title**: body"), where both of today's changes act: an opening
sentence that only restates the title or the question goes (`merge.drop_restating_opener`), then
a body that goes on with its title as subject loses the colon (`merge._format`). The rest of the
folder is copied as it is; plain cells are left alone.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from sglang_specsot.sot.merge import continues_title, drop_restating_opener

_POINT_LINE = re.compile(r"^(\d{1,2}\. \*\*(.+?)\*\*):\s(.*)$")


def remerge_answer(answer: str, question: str) -> str:
    """`answer` with each point's first line merged as today's merge would."""
    lines = []
    for line in answer.split("\n"):
        match = _POINT_LINE.match(line)
        if match:
            head, title, body = match.groups()
            body = drop_restating_opener(body, title, question)
            line = f"{head} {body}" if continues_title(title, body) else f"{head}: {body}"
        lines.append(line)
    return "\n".join(lines)


def remerge_run(run: Path, out: Path) -> int:
    """Copy `run`'s files to `out` with every SoT answer merged again; returns how many changed."""
    if out.resolve() == run.resolve():
        raise ValueError(f"OUT_DIR {out} is RUN_DIR: write the merged copy elsewhere")
    out.mkdir(parents=True, exist_ok=True)
    for path in run.iterdir():
        if path.is_file():
            shutil.copy(path, out / path.name)
    questions = {int(row["id"]): row["question"] for row in map(json.loads, (run / "questions.jsonl").open())}
    cells, changed = [], 0
    for cell in map(json.loads, (run / "cells.jsonl").open()):
        if cell.get("path") == "sot" and cell.get("config") != "plain":
            merged = remerge_answer(cell["answer"], questions[int(cell["question_id"])])
            changed += merged != cell["answer"]
            cell["answer"] = merged
        cells.append(json.dumps(cell))
    (out / "cells.jsonl").write_text("\n".join(cells) + "\n")
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a bench e2e folder with questions.jsonl and cells.jsonl")
    parser.add_argument("out", type=Path, help="where the merged copy goes")
    args = parser.parse_args()
    print(f"{remerge_run(args.run, args.out)} SoT answers changed; written to {args.out}")


if __name__ == "__main__":
    main()
