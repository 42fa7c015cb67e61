"""What a head is taught and how it is scored, per sequence.

Base position i of step k drafts the token at i + k + 2: the target's distribution there is
its logits at position j = i + k + 1. That position counts when the token it predicts is part
of the answer (j + 1 in [start, T)) and when the target's own choice there is a token the head
can propose (SpecForge's position mask). The loss is the cross-entropy from the target's
distribution, renormalised over the draft vocabulary, to the head's; steps weigh 0.8^k (EAGLE's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

STEP_DECAY = 0.8


@dataclass(frozen=True)
class Teacher:
    """One sequence's targets, indexed by the target position j."""

    probs: torch.Tensor  # [T, V_draft] float32: the target's distribution over the draft vocabulary
    greedy: torch.Tensor  # [T] long: the target's argmax over its whole vocabulary
    valid: torch.Tensor  # [T] bool: j predicts an answer token the head can propose


def teacher(seq: dict, draft_head_rows: torch.Tensor, t2d: torch.Tensor) -> Teacher:
    """`draft_head_rows` [V_draft, H]: the target's LM head rows of the draft vocabulary."""
    with torch.no_grad():
        logits = seq["final"].float() @ draft_head_rows.float().T
        greedy = seq["greedy"].long()
        t = greedy.numel()
        j = torch.arange(t)
        answer = (j + 1 >= seq["start"]) & (j + 1 < t)
        return Teacher(torch.softmax(logits, -1), greedy, answer & t2d[greedy])


def unrolled(head, seq: dict, embed: torch.Tensor, head_rows: torch.Tensor, steps: int) -> tuple[Teacher, list[torch.Tensor]]:
    """One sequence through the head's training-time test (bf16 autocast): its teacher, and
    per step the [T, V_draft] logits. `embed` is the target's embedding table."""
    t = teacher(seq, head_rows, head.t2d)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = head.unroll(seq["aux"].float()[None], lambda ids: embed[ids].float(), step_inputs(seq, steps), steps)
    return t, [x[0] for x in logits]


def step_inputs(seq: dict, steps: int) -> torch.Tensor:
    """[1, T + steps - 1]: column c holds token c + 1 (zero past the end, never scored)."""
    ids = seq["ids"].long()
    return F.pad(ids[1:], (0, steps))[None, : ids.numel() + steps - 1]


def shifted(x: torch.Tensor, k: int, length: int, fill) -> torch.Tensor:
    """x[i + k + 1] for i in 0..length-1, `fill` past the end."""
    out = x[k + 1 : k + 1 + length]
    pad = length - out.shape[0]
    if pad <= 0:
        return out
    return torch.cat([out, torch.full((pad, *x.shape[1:]), fill, dtype=x.dtype)])


def step_loss(logits: torch.Tensor, t: Teacher, k: int, target_ids: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(loss summed over counted positions, positions counted, of them drafted right) for step k."""
    length = logits.shape[0]
    mask = shifted(t.valid, k, length, False)
    n = int(mask.sum())
    if n == 0:
        return logits.sum() * 0.0, 0, 0
    probs = shifted(t.probs, k, length, 0.0)[mask]
    logp = torch.log_softmax(logits[mask].float(), -1)
    loss = -(probs * logp).sum()
    right = int((target_ids[logits[mask].argmax(-1)] == shifted(t.greedy, k, length, -1)[mask]).sum())
    return loss, n, right


def chain_hits(logits: list[torch.Tensor], t: Teacher, target_ids: torch.Tensor) -> torch.Tensor:
    """[T] how many leading draft steps from base i the target accepts under greedy decoding."""
    length = logits[0].shape[0]
    alive = torch.ones(length, dtype=torch.bool)
    hits = torch.zeros(length, dtype=torch.long)
    for k, step in enumerate(logits):
        truth = shifted(t.greedy, k, length, -1)
        inside = shifted(torch.arange(t.greedy.numel()) + 1 < t.greedy.numel(), k, length, False)
        alive = alive & inside & (target_ids[step.argmax(-1)] == truth)
        hits += alive.long()
    return hits


def walk(hits: torch.Tensor, start: int, total: int) -> tuple[int, int]:
    """(tokens, verify steps) of greedy chain decoding over an answer: the first draft is from
    base start - 1 (the last prompt position, with the first answer token as input); a verify
    from base p keeps hits[p] drafts and one token of its own, so the next base is p + hits + 1."""
    p, tokens, steps = start - 1, 0, 0
    while p + 1 < total - 1:
        gained = int(hits[p]) + 1
        tokens, steps, p = tokens + gained, steps + 1, p + gained
    return tokens, steps
