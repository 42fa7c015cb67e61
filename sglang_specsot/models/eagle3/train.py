"""Stage 3 of `train-eagle3`: fit the head on the features, resumably and deterministically.

Deterministic given the seed: the head's initial weights come from a generator seeded with it,
epoch e visits the training sequences in the order of a permutation seeded with (seed, e), and
nothing else draws randomness. A checkpoint (weights, optimiser, position) is written every
`checkpoint_every` updates and at the end of each epoch; a run resumed from one continues the
same sequence of updates, so it ends with the weights an uninterrupted run would have.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from sglang_specsot.models.eagle3.head import Eagle3Head, HeadShape
from sglang_specsot.models.eagle3.store import save_atomic
from sglang_specsot.models.eagle3.teacher import STEP_DECAY, step_loss, unrolled

logger = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class TrainConfig:
    """How a head is trained; `steps` is the training-time-test depth (the chain it is made for)."""

    steps: int = 4
    epochs: int = 6
    lr: float = 5e-4
    warmup: float = 0.05  # share of the updates spent warming the learning rate up
    accumulate: int = 1  # sequences per optimiser update
    clip: float = 0.5
    seed: int = 0
    checkpoint_every: int = 25  # updates

    def __post_init__(self) -> None:
        for name in ("steps", "epochs", "accumulate", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr} must be positive")


@dataclass(frozen=True)
class TargetParts:
    """The target's weights a head uses: its embedding (to read tokens) and the LM head rows
    and final norm of the draft vocabulary (to build the teacher, and to start the head from)."""

    embed: torch.Tensor  # [V, H]
    head_rows: torch.Tensor  # [V_draft, H]
    norm: torch.Tensor  # [H]
    last_mlp: dict[str, torch.Tensor]  # the target's last layer's MLP: the head's MLP starts from it


def init_head(shape: HeadShape, vocab: torch.Tensor, parts: TargetParts, seed: int) -> Eagle3Head:
    """Random weights from `seed` (normal, std 0.02, as HF's Llama), then the parts that have a
    counterpart in the target start from it: LM head rows, final norm, MLP. The attention's
    output projection starts at zero, so the first updates see the target's features whole."""
    gen = torch.Generator().manual_seed(seed)
    head = Eagle3Head(shape)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        head.set_vocab(vocab)
        head.lm_head.weight.copy_(parts.head_rows.float())
        head.norm.weight.copy_(parts.norm.float())
        for name, w in parts.last_mlp.items():
            getattr(head.midlayer.mlp, name).weight.copy_(w.float())
        head.midlayer.self_attn.o_proj.weight.zero_()
    return head


def lr_at(update: int, total: int, cfg: TrainConfig) -> float:
    warm = max(1, int(total * cfg.warmup))
    if update < warm:
        return cfg.lr * (update + 1) / warm
    progress = (update - warm) / max(1, total - warm)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def sequence_loss(head: Eagle3Head, seq: dict, parts: TargetParts, steps: int) -> tuple[torch.Tensor, list, list]:
    """The weighted loss of one sequence, and per step (positions counted, drafted right)."""
    t, logits = unrolled(head, seq, parts.embed, parts.head_rows, steps)
    target_ids = head.target_ids()
    total, counted, right = 0.0, [], []
    for k, out in enumerate(logits):
        loss, n, r = step_loss(out, t, k, target_ids)
        total = total + (STEP_DECAY**k) * loss / max(1, n)
        counted.append(n)
        right.append(r)
    return total, counted, right


def _order(n: int, seed: int, epoch: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch)).tolist()


def train(head: Eagle3Head, seqs: list[dict], parts: TargetParts, cfg: TrainConfig, work: Path,
          progress=None) -> Eagle3Head:  # fmt: skip
    """Train in place; resumes from `work/checkpoint.pt` when its config matches `cfg`."""
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    per_epoch = math.ceil(len(seqs) / cfg.accumulate)
    total = per_epoch * cfg.epochs
    state = {"epoch": 0, "update": 0, "log": []}
    ckpt = work / CHECKPOINT
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        if saved["config"] != asdict(cfg):
            raise ValueError(f"{ckpt} was written with {saved['config']}, not {asdict(cfg)}; "
                             "rerun with the same settings, or remove the work directory to start over")
        if not torch.equal(saved["head"]["d2t"], head.d2t):
            raise ValueError(f"{ckpt} trains another draft vocabulary (a different --draft-vocab, or other "
                             "answers); rerun with the same settings, or remove the work directory to start over")
        head.load_state_dict(saved["head"])
        opt.load_state_dict(saved["optimizer"])
        state = saved["state"]
    for epoch in range(state["epoch"], cfg.epochs):
        order = _order(len(seqs), cfg.seed, epoch)
        for update in range(state["update"] - epoch * per_epoch, per_epoch):
            batch = order[update * cfg.accumulate : (update + 1) * cfg.accumulate]
            began = time.monotonic()
            row = _update(head, opt, [seqs[i] for i in batch], parts, cfg, lr_at(state["update"], total, cfg))
            row.update(epoch=epoch, update=state["update"], seconds=round(time.monotonic() - began, 3))
            state["log"].append(row)
            state["update"] += 1
            if progress is not None:
                progress(state["update"], total, row)
            if state["update"] % cfg.checkpoint_every == 0:
                _save(ckpt, head, opt, state, cfg)
        state["epoch"] = epoch + 1
        _save(ckpt, head, opt, state, cfg)
    return head


def _update(head, opt, batch: list[dict], parts: TargetParts, cfg: TrainConfig, lr: float) -> dict:
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    counted, right, loss_sum, tokens = [0] * cfg.steps, [0] * cfg.steps, 0.0, 0
    for seq in batch:
        loss, n, r = sequence_loss(head, seq, parts, cfg.steps)
        (loss / len(batch)).backward()
        loss_sum += float(loss.detach()) / len(batch)
        counted = [a + b for a, b in zip(counted, n)]
        right = [a + b for a, b in zip(right, r)]
        tokens += int(seq["ids"].numel())
    torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.clip)
    opt.step()
    return {"loss": round(loss_sum, 4), "tokens": tokens, "lr": lr,
            "acc": [round(r / n, 4) if n else None for r, n in zip(right, counted)]}  # fmt: skip


def _save(path: Path, head, opt, state: dict, cfg: TrainConfig) -> None:
    save_atomic({"head": head.state_dict(), "optimizer": opt.state_dict(), "state": state, "config": asdict(cfg)}, path)

