"""Pairwise judgement of each SoT answer against the plain answer by a judge model, asked in
both orders (position bias); orders that disagree make a tie. Appends to judge.jsonl."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_specsot.bench.cells import post_json
from sglang_specsot.bench.configs import BASELINE
from sglang_specsot.bench.metrics import combine_verdicts, parse_verdict
from sglang_specsot.bench.store import OK, CellResult

logger = logging.getLogger(__name__)
JUDGE_FILE = "judge.jsonl"
ANSWER_CHARS = 3000  # each answer is cut to this many characters to keep the prompt bounded
PROMPT = """You are a fair judge. Compare two answers to the user's question.

[Question]
{question}

[Answer A]
{a}

[Answer B]
{b}

Which answer is more helpful, correct and complete? Reply with exactly one word: A, B or tie."""


@dataclass(frozen=True, slots=True)
class Judgement:
    question_id: int
    config: str
    sot_first: str | None  # the judge's reply with the SoT answer shown as A
    normal_first: str | None  # ... shown as B
    verdict: str  # for the SoT answer: win | tie | loss


def load_judgements(out: Path) -> dict[str, dict[int, str]]:
    """{config: {question_id: verdict}} from judge.jsonl (missing file: empty)."""
    path = out / JUDGE_FILE
    result: dict[str, dict[int, str]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            result.setdefault(row["config"], {})[row["question_id"]] = row["verdict"]
    return result


def pending(cells: dict[tuple[int, str], CellResult], configs: list[str], judged: dict) -> list[tuple[CellResult, CellResult]]:
    """(SoT cell, plain cell) pairs still to judge: both successful, answers different."""
    out = []
    for (qid, name), cell in sorted(cells.items()):
        base = cells.get((qid, BASELINE))
        if name in configs and cell.status == OK and base and base.status == OK and qid not in judged.get(name, {}):
            out.append((cell, base))
    return out


def judge_pair(url: str, render, question: str, sot: str, normal: str, timeout: float) -> tuple[str | None, str | None]:
    replies = []
    for a, b in ((sot, normal), (normal, sot)):
        prompt = render([{"role": "user", "content": PROMPT.format(
            question=question, a=a[:ANSWER_CHARS], b=b[:ANSWER_CHARS])}])  # fmt: skip
        out = post_json(url + "/generate", {"text": prompt, "sampling_params": {
            "temperature": 0, "max_new_tokens": 8}}, timeout)  # fmt: skip
        replies.append(parse_verdict(out["text"]))
    return replies[0], replies[1]


def record(out: Path, cell: CellResult, replies: tuple[str | None, str | None]) -> Judgement:
    # Identical answers need no judge, but they still count as a tie through combine_verdicts.
    judgement = Judgement(cell.question_id, cell.config, *replies, combine_verdicts(*replies))
    with (out / JUDGE_FILE).open("a") as f:
        f.write(json.dumps(asdict(judgement)) + "\n")
    return judgement
