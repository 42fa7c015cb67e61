"""Would a probe on the served model's own hidden state route SoT better than a sentence embedding?

The SoT authors labelled a question suitable when a strong model's answer to it is a list of
points, each worth expanding. A sentence embedding of the question sees its topic and phrasing;
the served model, fed the question in its chat template, is about to write its answer, and its
hidden state at that position may already say whether the answer will be a list. This script
measures that, offline, with the same training sets, grid rule and check as
`python -m sglang_specsot.models.router_classifier train`:

    .venv/bin/python examples/router_probe.py extract MODEL_DIR OUT   # hidden states per set (resumable; --dtype)
    .venv/bin/python examples/router_probe.py evaluate OUT            # CV choice, then the check, once

`extract` keeps the last position's hidden state (the generation prompt's last token) at four
depths of the model; a question longer than 320 tokens keeps its first and last 160. `evaluate`
picks the depth, L2 strength and threshold by 5-fold cross-validation on the training sets (the
most accurate with precision >= the trainer's MIN_PRECISION, routing as shipped: hard rules
first), refits, and scores `sot_wizardlm` once. Nothing here is wired into the server: serving
would need the question's hidden state from the served model (a prefill the normal answer's
prompt shares), which is not built.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from sglang_specsot.models import router_classifier as rc
from sglang_specsot.sot.agreement import load_labelled

SETS = (*rc.TRAIN_SETS, "sot_wizardlm")
MAX_TOKENS, KEEP = 320, 160
L2_GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
THRESHOLD_GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def extract(model_dir: Path, out: Path, dtype: str = "bfloat16", sets: tuple[str, ...] = SETS) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    n = model.config.num_hidden_layers
    layers = sorted({n // 2, 2 * n // 3, 5 * n // 6, n})
    for name in sets:
        path = out / f"{name}.npz"
        if path.exists():
            continue  # resumable: a set is written whole or not at all
        rows, feats, started = load_labelled(name), {layer: [] for layer in layers}, time.time()
        for i, row in enumerate(rows):
            text = tokenizer.apply_chat_template([{"role": "user", "content": row.question}], tokenize=False,
                                                 add_generation_prompt=True)  # fmt: skip
            ids = tokenizer(text, return_tensors="pt").input_ids
            if ids.shape[1] > MAX_TOKENS:  # the template's tail is where the answer starts
                ids = torch.cat([ids[:, :KEEP], ids[:, -KEEP:]], dim=1)
            with torch.no_grad():
                states = model(ids, output_hidden_states=True).hidden_states
            for layer in layers:
                feats[layer].append(states[layer][0, -1].float().numpy())
            if i % 100 == 0:
                print(json.dumps({"set": name, "done": i, "of": len(rows), "seconds": round(time.time() - started)}))
        labels = np.array([r.sot_suitable for r in rows], dtype=float)
        np.savez(path, labels=labels, **{f"L{layer}": np.stack(v) for layer, v in feats.items()})


def _features(stack: np.ndarray, mean: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    unit = stack / np.linalg.norm(stack, axis=1, keepdims=True)
    mean = unit.mean(0) if mean is None else mean
    return (unit - mean) * 10, mean  # centred, at the scale of the grid's L2 strengths


def evaluate(out: Path) -> dict:
    data = rc.load_training_set(rc.TRAIN_SETS)
    stored = [np.load(out / f"{name}.npz") for name in rc.TRAIN_SETS]
    layers = [k for k in stored[0].files if k.startswith("L")]
    features = {layer: _features(np.concatenate([s[layer] for s in stored])) for layer in layers}
    candidates = []
    for layer in layers:
        for l2 in L2_GRID:
            p = rc.cross_validated_probabilities(features[layer][0], data, l2)
            candidates += [((layer, l2, t), rc.route_agreement(data.questions, data.labels, p, t)) for t in THRESHOLD_GRID]
    (layer, l2, t), cv = rc.most_accurate(candidates)
    x, mean = features[layer]
    head = rc.fit_head(x, data.labels, l2, t)
    check = np.load(out / "sot_wizardlm.npz")
    xc, _ = _features(check[layer], mean)
    questions = [r.question for r in load_labelled("sot_wizardlm")]
    a = rc.route_agreement(questions, check["labels"], np.array([head.probability(v) for v in xc]), t)
    rates = lambda r: {"accuracy": round(r.accuracy, 4), "precision": round(r.precision, 4), "recall": round(r.recall, 4)}  # noqa: E731
    return {"layer": layer, "l2": l2, "threshold": t, "cross_validated": rates(cv), "sot_wizardlm": {"n": a.total, **rates(a)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("extract")
    e.add_argument("model_dir", type=Path)
    e.add_argument("out", type=Path)
    e.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                   help="float32 where the CPU has no native bf16 (AVX2 only): several times faster there")
    e.add_argument("--sets", nargs="+", default=list(SETS), help="the labelled sets to extract (default: all)")
    v = sub.add_parser("evaluate")
    v.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.command == "extract":
        extract(args.model_dir, args.out, args.dtype, tuple(args.sets))
    else:
        print(json.dumps(evaluate(args.out)))


if __name__ == "__main__":
    main()
