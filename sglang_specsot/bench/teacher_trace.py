"""A draft model's greedy chain acceptance on a target's recorded answers, computed offline.

Greedy speculative decoding is lossless: the committed tokens are the target's greedy answer,
whatever the draft proposes. So the drafts a chain of `k` would have accepted at each decode
step follow from two things only: the recorded answer and the draft's own greedy next token at
every position of it. A draft token at depth d is compared only after depths 1..d-1 matched the
answer, so the draft has then seen exactly the answer's tokens: its proposal is its
teacher-forced argmax there, and one forward of the draft over prompt + answer gives every
step's acceptance. SGLang's draft reads its input one token ahead (eagle_worker_v2.py:991, for
a draft model as for EAGLE's head): its KV slot p holds token p + 1, so the draft never sees a
prompt's first token, and the teacher drops it too (`TeacherDraft.next_tokens`). With that,
this is what a SPECSOT server drafting a `k`-token chain with that draft
accepts (`bench e2e --trace` records the same from a serving run, at a cost a 2-core CPU cannot
pay for a 1.5B target), without SPECSOT's extra SoT-context nodes: a floor for SpecSoT.

The result is an acceptance trace (speculative/trace.py lines) and the answers' shapes
(trace_shapes.AnswerShape) for the device's replay stage, from an e2e run's plain and
SoT-server cells. The answer text is re-tokenized, so a count can differ from the served one by
a token or two at a boundary; the shapes keep the served counts where the run recorded them. The
prompts are rendered by this code's `sot.prompts`, not the run's: after a prompt change the
skeleton's and branches' prompts (and the draft's view of them) are today's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

from sglang_specsot.bench.store import OK, CellResult, load
from sglang_specsot.bench.endings import split_points
from sglang_specsot.bench.trace_shapes import AnswerShape, write_folder
from sglang_specsot.sot.gen_requests import shared_prefix
from sglang_specsot.sot.prompts import SKELETON_PREFILL, expansion_prompt, normal_messages, skeleton_prompt
from sglang_specsot.speculative.trace import TraceStep

Render = Callable[[list[dict]], str]
_POINT_LINE = re.compile(r"^(\d{1,2})\. \*\*(?P<title>.+?)\*\*:?(?:\s(?P<body>.*))?$")


def chain_steps(rid: str, answer: Sequence[int], draft_next: Sequence[int], k: int) -> list[TraceStep]:
    """The decode steps of `answer` (its first token from prefill) under a `k`-token chain:
    `draft_next[i]` is the draft's greedy token after answer[: i + 1]. Each step accepts the
    drafts that match the answer, up to k and up to the answer's last token but one (the last
    is always the bonus of some step), then commits one bonus token."""
    if len(draft_next) < len(answer) - 1:
        raise ValueError(f"draft_next has {len(draft_next)} tokens for an answer of {len(answer)}")
    parents = (-1, *range(k))
    steps, committed = [], 1
    while committed < len(answer):
        limit = min(k, len(answer) - committed - 1)
        accepted = 0
        while accepted < limit and draft_next[committed - 1 + accepted] == answer[committed + accepted]:
            accepted += 1
        steps.append(TraceStep(rid, k + 1, parents, accepted, accepted))
        committed += accepted + 1
    return steps


class TeacherDraft:
    """The draft model (transformers, CPU) and the tokenizer both models share."""

    def __init__(self, draft_path: str, tokenizer_path: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.model = AutoModelForCausalLM.from_pretrained(draft_path, torch_dtype=torch.float32).eval()

    def render(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def next_tokens(self, prompt_ids: list[int], answer: list[int]) -> list[int]:
        """The draft's greedy token after each prefix prompt_ids + answer[: i + 1], as SGLang's
        draft sees it: without the prompt's first token (it reads one token ahead)."""
        seen = prompt_ids[1:]
        with self.torch.inference_mode():
            logits = self.model(self.torch.tensor([seen + answer])).logits[0]
        return logits[len(seen) :].argmax(-1).tolist()

    def steps(self, rid: str, prompt: str, text: str, k: int, eos: bool = True) -> tuple[list[TraceStep], int]:
        """(the chain's steps over `text` asked with `prompt`, the prompt's tokens); `eos`: the
        answer ended with the end-of-turn token, which its last step committed too."""
        prompt_ids = self.ids(prompt)
        answer = self.ids(text) + ([self.tokenizer.eos_token_id] if eos else [])
        return chain_steps(rid, answer, self.next_tokens(prompt_ids, answer), k), len(prompt_ids)


def sot_parts(cell: CellResult) -> tuple[list[str], list[str]]:
    """(titles, bodies) of a SoT answer in the "i. **Title**: body" format (merge._format); a
    body's continuation lines (a list it wrote) stay with it."""
    titles: list[str] = []
    bodies: list[str] = []
    for point in split_points(cell.answer):
        head, newline, rest = point.partition("\n")
        match = _POINT_LINE.match(head)
        if match:
            titles.append(match["title"])
            bodies.append((match["body"] or "") + newline + rest)
        elif bodies:
            bodies[-1] += "\n" + point
    return titles, bodies


def question_trace(teacher: TeacherDraft, question: str, plain: CellResult, sot: CellResult | None,
                   k: int) -> tuple[AnswerShape, list[TraceStep]]:  # fmt: skip
    """One question's shape and the chain steps of its normal answer and SoT parts."""
    qid, group = plain.question_id, f"specsot-{plain.question_id:x}0"  # a hex group, as served rids have
    normal_rid = f"q{qid}-normal"
    steps, prompt_tokens = teacher.steps(normal_rid, teacher.render(normal_messages(question)), plain.answer, k,
                                         eos=plain.finish_reason != "length")  # fmt: skip
    shape = AnswerShape(qid, plain.output_tokens, prompt_tokens, normal_rid)
    titles, bodies = sot_parts(sot) if sot is not None and sot.path == "sot" else ([], [])
    if not titles:
        return shape, steps
    skeleton_rid = f"{group}-skeleton-1"
    skeleton = skeleton_prompt(question)
    skeleton_steps, skeleton_prompt_tokens = teacher.steps(
        skeleton_rid, skeleton.render(teacher.render), sot.skeleton_text.removeprefix(SKELETON_PREFILL), k)
    steps += skeleton_steps
    prompts = [expansion_prompt(question, titles, i).render(teacher.render) for i in range(len(titles))]
    prefix = teacher.ids(shared_prefix(prompts))
    rids = []
    for i, (prompt, body) in enumerate(zip(prompts, bodies)):
        rids.append(f"{group}-branch{i}-{i + 2}")
        steps += teacher.steps(rids[-1], prompt, " " + body.strip(), k)[0]
    served = {b.index: b.tokens for b in sot.branches}
    branch_tokens = tuple(served.get(i) or len(teacher.ids(bodies[i])) for i in range(len(titles)))
    suffix = sorted(len(teacher.ids(p)) - len(prefix) for p in prompts)[len(prompts) // 2]
    parts = sot.token_parts or {}
    return AnswerShape(qid, plain.output_tokens, prompt_tokens, normal_rid,
                       parts.get("skeleton") or len(teacher.ids(sot.skeleton_text)),
                       skeleton_prompt_tokens, skeleton_rid, branch_tokens, tuple(rids), len(prefix), suffix), steps  # fmt: skip


def write(run: Path, questions: dict[int, str], teacher: TeacherDraft, out: Path, k: int = 4,
          sot_config: str = "SoT-server") -> dict:  # fmt: skip
    """answers.jsonl, trace.jsonl and acceptance.json in `out` for every question of `run` with
    an ok plain cell; returns the acceptance summary."""
    cells = {key: c for key, c in load(run / "cells.jsonl").items() if c.status == OK}
    shapes, trace = [], []
    for qid in sorted(q for q, config in cells if config == "plain"):
        shape, steps = question_trace(teacher, questions[qid], cells[(qid, "plain")], cells.get((qid, sot_config)), k)
        shapes.append(shape)
        trace += steps
    by_rid: dict[str, list[TraceStep]] = {}
    for step in trace:
        by_rid.setdefault(step.rid, []).append(step)
    return write_folder(out, shapes, by_rid)
