"""Offline scoring of a head: greedy chain decoding replayed over held-out answers.

Under greedy verification a draft is kept while it equals the target's argmax, so the target's
own answer, teacher-forced, decides every verify step: `teacher.chain_hits` gives how many
drafts the target keeps from each base position, and `teacher.walk` steps through the answer
as decoding would (one verify per base, then on past what it kept). The accept length is
tokens per verify step, the bonus token included, as SGLang reports it.

`context_score` replays SPECSOT's context drafter over the same answers with the same number of
draft tokens a verify, so the head is compared with the drafter SPECSOT has without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_specsot.models.eagle3.head import Eagle3Head
from sglang_specsot.models.eagle3.teacher import chain_hits, unrolled, walk
from sglang_specsot.speculative.context_draft import ContextDrafter


@dataclass(frozen=True)
class ChainScore:
    accept_length: float  # tokens per verify step, bonus included
    tokens: int
    verifies: int
    step_acc: tuple[float, ...]  # per draft step: share of base positions drafted right, given the earlier steps were


def score(head: Eagle3Head, seqs: list[dict], embed: torch.Tensor, head_rows: torch.Tensor, steps: int) -> ChainScore:
    if not seqs:
        raise ValueError("no held-out sequences to score the head on")
    tokens = verifies = 0
    alive = [0] * (steps + 1)
    target_ids = head.target_ids()
    with torch.no_grad():
        for seq in seqs:
            t, logits = unrolled(head, seq, embed, head_rows, steps)
            hits = chain_hits(logits, t, target_ids)
            n, v = walk(hits, seq["start"], seq["ids"].numel())
            tokens, verifies = tokens + n, verifies + v
            bases = hits[seq["start"] - 1 : seq["ids"].numel() - 2]
            for k in range(steps + 1):
                alive[k] += int((bases >= k).sum())
    acc = tuple(round(alive[k + 1] / alive[k], 4) if alive[k] else 0.0 for k in range(steps))
    return ChainScore(round(tokens / max(1, verifies), 4), tokens, verifies, acc)


def context_score(answers: list[dict], drafts: int, shared: bool = False) -> float:
    """Accept length of SPECSOT's context drafter over `answers` (rows with prompt_ids and
    answer_ids), trees of `drafts` tokens below the root, greedy, tokens over verifies of all
    answers (as `score`). Unshared, each answer drafts from its own prompt and output only, as
    the head does; `shared` replays them in order through one drafter, as a server answering
    them one after another, whose corpus then holds the earlier answers."""
    if not answers:
        raise ValueError("no held-out answers to replay the context drafter over")
    tokens = verifies = 0
    drafter = ContextDrafter()
    for i, row in enumerate(answers):
        if not shared:
            drafter = ContextDrafter()
        n, v = _replay(drafter, f"heldout-{i}", row["prompt_ids"], row["answer_ids"], drafts)
        tokens, verifies = tokens + n, verifies + v
    return round(tokens / max(1, verifies), 4)


def _replay(drafter: ContextDrafter, rid: str, prompt: list[int], out: list[int], drafts: int) -> tuple[int, int]:
    """(tokens, verifies) of greedy decoding of `out` with the drafter's trees; the first
    token is prefill's."""
    drafter.start(rid, prompt + out[:1])
    pos, tokens, verifies = 1, 0, 0
    while pos < len(out):
        tree = drafter.propose(rid, drafts + 1)
        gained = min(tree.accepted(out[pos:]) + 1, len(out) - pos)
        drafter.append(rid, out[pos : pos + gained])
        pos, tokens, verifies = pos + gained, tokens + gained, verifies + 1
    drafter.forget(rid)
    return tokens, verifies
