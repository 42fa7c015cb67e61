"""Pairwise judgement of each SoT answer against the plain answer by a judge model, asked in
both orders (position bias); orders that disagree make a tie. A second, calibrated verdict
compares log P("A") - log P("B") of the judge's first token across the two orders, which
cancels a judge that always names the first answer. Appends to judge.jsonl."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_specsot.bench.cells import post_json
from sglang_specsot.bench.configs import BASELINE
from sglang_specsot.bench.metrics import calibrated_verdict, combine_verdicts, parse_verdict
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
class Reply:
    """The judge's answer to one order: its word, and log P("A") - log P("B") of its first token."""

    word: str | None
    margin: float | None


@dataclass(frozen=True, slots=True)
class Judgement:
    question_id: int
    config: str
    sot_first: str | None  # the judge's reply with the SoT answer shown as A
    normal_first: str | None  # ... shown as B
    verdict: str  # for the SoT answer: win | tie | loss (orders must agree)
    sot_first_margin: float | None = None  # log P(A) - log P(B), SoT shown as A
    normal_first_margin: float | None = None  # ... SoT shown as B
    calibrated: str = ""  # win | tie | loss from the two margins (metrics.calibrated_verdict)


def load_judgements(out: Path, key: str = "verdict") -> dict[str, dict[int, str]]:
    """{config: {question_id: row[key]}} from judge.jsonl (missing file or key: empty)."""
    path = out / JUDGE_FILE
    result: dict[str, dict[int, str]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get(key):
                result.setdefault(row["config"], {})[row["question_id"]] = row[key]
    return result


def pending(cells: dict[tuple[int, str], CellResult], configs: list[str], judged: dict) -> list[tuple[CellResult, CellResult]]:
    """(SoT cell, plain cell) pairs still to judge: both successful, answers different."""
    out = []
    for (qid, name), cell in sorted(cells.items()):
        base = cells.get((qid, BASELINE))
        if name in configs and cell.status == OK and base and base.status == OK and qid not in judged.get(name, {}):
            out.append((cell, base))
    return out


def judge_pair(url: str, render, choice_ids: tuple[int, int], question: str, sot: str, normal: str,
               timeout: float) -> tuple[Reply, Reply]:  # fmt: skip
    """Ask in both orders (SoT as A, then as B); `choice_ids` are the token ids of "A" and "B"."""
    return tuple(_ask_judge(url, render, choice_ids, question, a, b, timeout) for a, b in ((sot, normal), (normal, sot)))


def _ask_judge(url: str, render, choice_ids: tuple[int, int], question: str, a: str, b: str, timeout: float) -> Reply:
    prompt = render([{"role": "user", "content": PROMPT.format(question=question, a=a[:ANSWER_CHARS], b=b[:ANSWER_CHARS])}])
    out = post_json(url + "/generate", {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 8},
                                        "return_logprob": True, "token_ids_logprob": list(choice_ids)}, timeout)  # fmt: skip
    return Reply(parse_verdict(out["text"]), first_token_margin(out["meta_info"], choice_ids))


def first_token_margin(meta: dict, choice_ids: tuple[int, int]) -> float | None:
    """log P(A) - log P(B) at the first generated token, from SGLang's output_token_ids_logprobs
    (per output token: [(logprob, token_id, text), ...]); None if SGLang returned none."""
    steps = meta.get("output_token_ids_logprobs") or []
    if not steps or not steps[0]:
        return None
    by_id = {int(entry[1]): float(entry[0]) for entry in steps[0]}
    if choice_ids[0] not in by_id or choice_ids[1] not in by_id:
        return None
    return by_id[choice_ids[0]] - by_id[choice_ids[1]]


def record(out: Path, cell: CellResult, replies: tuple[Reply, Reply]) -> Judgement:
    first, second = replies
    judgement = Judgement(cell.question_id, cell.config, first.word, second.word, combine_verdicts(first.word, second.word),
                          first.margin, second.margin, calibrated_verdict(first.margin, second.margin))  # fmt: skip
    with (out / JUDGE_FILE).open("a") as f:
        f.write(json.dumps(asdict(judgement)) + "\n")
    return judgement
