"""Would fine-tuning the sentence encoder itself route SoT better than a head on its frozen output?

The shipped classifier is a logistic head over all-MiniLM-L6-v2's fixed embeddings. The SoT
authors trained their router the other way: the whole encoder (RoBERTa) fine-tuned on their LIMA
labels. This script measures that with the shipped encoder, offline, under the trainer's rules:
the same training sets and folds, routing as shipped (hard rules first), the most accurate
setting with cross-validated precision >= MIN_PRECISION, then each check set scored once:

    .venv/bin/python examples/router_finetune.py cv OUT      # 5-fold CV, a file per fold (resumable)
    .venv/bin/python examples/router_finetune.py check OUT   # the CV choice refitted on all, then the checks

The model: mean pooling and unit length as shipped, times 10, into one logistic unit; binary
cross-entropy, AdamW (weight decay 0.01; encoder 3e-5, head 1e-3), batches of 16 questions of
similar length, 6% warm-up then linear decay over EPOCHS, 128 tokens, seed 0. CV keeps every
epoch's held-out probabilities of one EPOCHS-long schedule, so the grid is epochs x threshold;
the refit runs a schedule over the chosen epoch count. On 2 cores, `cv` takes about 20 minutes
and `check` 5. Nothing here is wired into the server: serving it would mean shipping a
fine-tuned encoder (or an adapter) instead of 385 numbers.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from sglang_specsot.models import router_classifier as rc
from sglang_specsot.sot.agreement import load_labelled

EPOCHS = 4
THRESHOLD_GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
CHECK_SETS = (*rc.NEVER_TRAINED_ON, "dolly_categories")
ENCODER_LR, HEAD_LR, BATCH, MAX_TOKENS, WARMUP = 3e-5, 1e-3, 16, 128, 0.06


def _classifier():
    import torch
    from transformers import AutoModel, AutoTokenizer

    from sglang_specsot.models.embedding import fetch_embedding_model

    path = str(fetch_embedding_model())

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.encoder = AutoModel.from_pretrained(path)
            self.head = torch.nn.Linear(self.encoder.config.hidden_size, 1)

        def forward(self, texts: list[str]):
            batch = self.tokenizer(texts, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
            hidden = self.encoder(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=-1)
            return self.head(pooled * 10).squeeze(-1)

    return Classifier()


def _predict(model, texts: list[str]) -> np.ndarray:
    import torch

    model.eval()
    with torch.no_grad():
        out = [torch.sigmoid(model(texts[i : i + 64])) for i in range(0, len(texts), 64)]
    model.train()
    return torch.cat(out).numpy() if out else np.zeros(0)


def fit(texts: list[str], labels: np.ndarray, epochs: int, held: list[str] | None = None):
    """The fine-tuned classifier and, with `held`, its probabilities on them after each epoch."""
    import torch

    torch.manual_seed(0)
    model = _classifier().train()
    groups = [
        {"params": model.encoder.parameters(), "lr": ENCODER_LR},
        {"params": model.head.parameters(), "lr": HEAD_LR},
    ]
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01)
    steps = epochs * math.ceil(len(texts) / BATCH)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / (WARMUP * steps)) * max(0.0, (steps - s) / steps)
    )  # fmt: skip
    y = torch.tensor(labels, dtype=torch.float32)
    rng, lengths, per_epoch = np.random.default_rng(0), np.array([len(t) for t in texts]), []
    for _ in range(epochs):
        order = np.argsort(lengths + rng.uniform(0, 20, len(texts)))  # similar lengths, jittered
        batches = [order[i : i + BATCH] for i in range(0, len(texts), BATCH)]
        for b in rng.permutation(len(batches)):
            idx = batches[b]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model([texts[j] for j in idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        if held is not None:
            per_epoch.append(_predict(model, held))
    return model, per_epoch


def cross_validate(out: Path) -> None:
    data = rc.load_training_set(rc.TRAIN_SETS)
    out.mkdir(parents=True, exist_ok=True)
    for fold in range(rc.FOLDS):
        path = out / f"fold{fold}.npy"
        if path.exists():
            continue  # resumable: a fold is written whole or not at all
        held = data.folds == fold
        train = [q for q, h in zip(data.questions, held) if not h]
        _, per_epoch = fit(train, data.labels[~held], EPOCHS, [q for q, h in zip(data.questions, held) if h])
        np.save(path, np.stack(per_epoch))
        print(json.dumps({"fold": fold, "done": True}), flush=True)


def choose(data: rc.TrainingSet, probabilities: np.ndarray) -> tuple[int, float, rc.RouterAgreement]:
    """(epochs, threshold, CV agreement): the most accurate with precision >= MIN_PRECISION.
    `probabilities[e]` are every question's held-out probabilities after epoch e + 1."""
    candidates = (((e + 1, t), rc.route_agreement(data.questions, data.labels, p, t))
                  for e, p in enumerate(probabilities) for t in THRESHOLD_GRID)  # fmt: skip
    (epochs, threshold), agreement = rc.most_accurate(candidates)
    return epochs, threshold, agreement


def _rates(a: rc.RouterAgreement) -> dict:
    rates = {"accuracy": a.accuracy, "precision": a.precision, "recall": a.recall}
    return {"n": a.total, **{k: round(v, 4) for k, v in rates.items()}}


def check(out: Path) -> dict:
    data = rc.load_training_set(rc.TRAIN_SETS)
    probabilities = np.zeros((EPOCHS, len(data.labels)))
    for fold in range(rc.FOLDS):
        probabilities[:, data.folds == fold] = np.load(out / f"fold{fold}.npy")
    epochs, threshold, cv = choose(data, probabilities)
    model, _ = fit(data.questions, data.labels, epochs)
    result = {"epochs": epochs, "threshold": threshold, "cross_validated": _rates(cv)}
    for name in CHECK_SETS:
        rows = load_labelled(name)
        questions, labels = [r.question for r in rows], np.array([r.sot_suitable for r in rows], dtype=float)
        result[name] = _rates(rc.route_agreement(questions, labels, _predict(model, questions), threshold))
    (out / "check.json").write_text(json.dumps(result) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("cv", "check"):
        sub.add_parser(name).add_argument("out", type=Path)
    args = parser.parse_args()
    if args.command == "cv":
        cross_validate(args.out)
    else:
        print(json.dumps(check(args.out)))


if __name__ == "__main__":
    main()
