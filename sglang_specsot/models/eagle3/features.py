"""Stage 2 of `train-eagle3`: what the head reads and what it is taught, from the target.

One teacher-forced pass of the target over each prompt + answer gives, per position:
- `aux`: the residual stream after each of the head's three layers (`HeadShape.aux_layer_ids`),
  concatenated, which SGLang captures for an EAGLE-3 head at the same layers (a layer id i is
  the output of decoder layer i: HF's `hidden_states[i + 1]`);
- `final`: the last hidden state after the final norm, from which the trainer computes the
  target's logits over the draft vocabulary (the full 150k-wide logits per token would not fit
  on disk; the hidden state is exact and `hidden_size` wide);
- `greedy`: the target's argmax over its whole vocabulary, which verification compares with.
Sequences are written in shards of `SHARD` as they finish; a rerun reuses a shard only when it
holds exactly the token ids of the answers now in its place (answers added, edited or cut by
`--limit` are captured again, never read stale).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from sglang_specsot.models.eagle3.store import save_atomic

logger = logging.getLogger(__name__)

SHARD = 32


def _one(model, row: dict, aux_ids: tuple[int, ...]) -> dict:
    ids = torch.tensor(row["prompt_ids"] + row["answer_ids"], dtype=torch.long)
    with torch.inference_mode():
        out = model(ids[None], output_hidden_states=True, use_cache=False)
    states = out.hidden_states
    return {
        "id": row["id"],
        "split": row["split"],
        "ids": ids.to(torch.int32),
        "start": len(row["prompt_ids"]),
        "aux": torch.cat([states[i + 1][0] for i in aux_ids], dim=-1).to(torch.bfloat16),
        "final": states[-1][0].to(torch.bfloat16),
        "greedy": out.logits[0].argmax(-1).to(torch.int32),
    }


def write_features(target: str, answers: list[dict], features: Path, aux_ids: tuple[int, ...]) -> list[Path]:
    """Shard k holds answers[k * SHARD : (k + 1) * SHARD] in the given order; returns the
    shards of these answers only."""
    shards = [answers[i : i + SHARD] for i in range(0, len(answers), SHARD)]
    paths = [features / f"shard-{k:05d}.pt" for k in range(len(shards))]
    todo = [k for k in range(len(shards)) if not _current(paths[k], shards[k])]
    if todo:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16).eval()
        for k in todo:
            save_atomic([_one(model, row, aux_ids) for row in shards[k]], paths[k])
            logger.info("features: shard %d / %d", k + 1, len(shards))
    return paths


def _current(path: Path, rows: list[dict]) -> bool:
    """Whether the shard at `path` holds exactly `rows`' sequences, in order (memory-mapped:
    only the token ids are read, not the captured layers)."""
    if not path.exists():
        return False
    seqs = torch.load(path, weights_only=True, mmap=True)
    return len(seqs) == len(rows) and all(
        s["id"] == r["id"] and s["ids"].tolist() == r["prompt_ids"] + r["answer_ids"] for s, r in zip(seqs, rows)
    )


def load_features(paths: list[Path]) -> list[dict]:
    return [s for p in paths for s in torch.load(p, weights_only=True)]
