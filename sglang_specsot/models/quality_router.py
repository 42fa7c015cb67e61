"""Trains the quality router's head (sot/quality_gate.py) on blind readers' verdicts.

    python -m sglang_specsot.models.quality_router train DIR [DIR ...] [--out PATH]

Each DIR is a `bench e2e` folder where SoT was forced beside the greedy normal answer and the
pairs were judged blind (`bench blind-score` wrote judge.jsonl): its questions.jsonl, run.json,
cells.jsonl and judge.jsonl are read. A pair's label is 1 where the reader preferred the normal
answer (a loss for SoT), 0 for a win or a tie. Held-out question sets are refused.

The rule, fixed before the tuning verdicts were read (benchmarks/e2e-router-quality-tuning-*):
- Candidates: logistic regression (`router_classifier.fit_head`) over the skeleton's numbers
  (`quality_gate.skeleton_features`, standardized) or the question's all-MiniLM-L6-v2 embedding,
  at each L2 strength of L2_GRID.
- Each is scored by leave-one-out P(loss): its AUC. One counts only at AUC >= MIN_AUC; of those,
  the highest AUC is chosen (ties: the first of REPRESENTATIONS, then the smaller L2).
- Its threshold, from THRESHOLD_GRID: the one keeping the most answers on SoT with losses kept
  <= MAX_LOSS_SHARE of all answers (a vetoed answer is a normal one: a tie); if none does, the
  one keeping the fewest losses (ties: more on SoT).
- Nothing counting, no head is written: the gate vetoes nothing, and the report says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sglang_specsot.models.embedding import NAME as EMBEDDING_NAME
from sglang_specsot.models.router_classifier import fit_head
from sglang_specsot.sot.budget import remaining
from sglang_specsot.sot.config import DEFAULT_CONFIG
from sglang_specsot.sot.phase_steps import fitted_plan, parsed_skeleton
from sglang_specsot.sot.prompts import SKELETON_PREFILL
from sglang_specsot.sot.quality_gate import FEATURE_NAMES, QUALITY_HEAD_PATH, QUESTION, SKELETON, SKELETON_FEATURES
from sglang_specsot.sot.quality_gate import skeleton_features
from sglang_specsot.sot.router import quality_veto
from sglang_specsot.sot.router_head import LinearHead

REPRESENTATIONS = (SKELETON, QUESTION)
L2_GRID = (0.01, 0.03, 0.1, 0.3, 1.0)
THRESHOLD_GRID = (0.3, 0.4, 0.5, 0.6, 0.7)
MIN_AUC = 0.65
MAX_LOSS_SHARE = 0.10
SOT_CONFIG = "SoT-server"
HELD_OUT_SOURCES = ("router_holdout", "router_holdout2")
SELECTION = (f"leave-one-out over {list(REPRESENTATIONS)} x l2 {list(L2_GRID)}; the highest AUC at >= {MIN_AUC}; "
             f"the threshold of {list(THRESHOLD_GRID)} keeping most answers on SoT with losses kept <= "
             f"{MAX_LOSS_SHARE} of all (else the fewest losses)")


@dataclass(frozen=True, slots=True)
class JudgedPair:
    """One judged question: what the gate would read (question, planned titles) and the label."""

    run: str
    question_id: int
    question: str
    titles: tuple[str, ...]
    loss: int  # 1: the reader preferred the normal answer


def load_pairs(dirs: Sequence[str | Path]) -> list[JudgedPair]:
    """The judged SoT pairs of `dirs`. Left out: a question SoT did not answer by SoT (no branch
    was written, nothing the gate could have stopped) and one `router.quality_veto` answers
    normally before the gate is reached (a changed premise)."""
    pairs = []
    for folder in map(Path, dirs):
        questions = {int(r["id"]): r for r in _rows(folder / "questions.jsonl")}
        held = sorted({str(r.get("source")) for r in questions.values()} & set(HELD_OUT_SOURCES))
        if held:
            raise ValueError(f"{folder} holds held-out questions ({held}): train on tuning runs only")
        cap = json.loads((folder / "run.json").read_text()).get("max_tokens")
        cells = {int(c["question_id"]): c for c in _rows(folder / "cells.jsonl") if c["config"] == SOT_CONFIG}
        for verdict in _rows(folder / "judge.jsonl"):
            qid = int(verdict["question_id"])
            cell = cells.get(qid)
            if verdict.get("config") != SOT_CONFIG or cell is None or cell.get("path") != "sot":
                continue
            question = questions[qid]["question"]
            if quality_veto(question) is not None:
                continue
            titles = planned_titles(question, cell, cap)
            if titles:
                pairs.append(JudgedPair(str(folder), qid, question, titles, int(verdict["verdict"] == "loss")))
    if not pairs:
        raise ValueError(f"no judged SoT pairs in {[str(d) for d in dirs]}: run `bench blind-score` on them first")
    return pairs


def planned_titles(question: str, cell: dict, cap: int | None) -> tuple[str, ...]:
    """The titles the runner planned from a recorded skeleton (parse, cover the question's
    items, fit the cap that the skeleton left): what the gate reads in a live answer."""
    # A recorded cell keeps the skeleton's text, not its finish reason: read as not cut.
    parse = parsed_skeleton(question, cell.get("skeleton_text") or "", DEFAULT_CONFIG,
                            prefill=SKELETON_PREFILL, truncated=False)  # fmt: skip
    spent = (cell.get("token_parts") or {}).get("skeleton", 0)
    plan, _ = fitted_plan(parse, remaining(cap, spent), DEFAULT_CONFIG)
    return plan.points if plan is not None else ()


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def features(pairs: Sequence[JudgedPair], representation: str, embedder=None) -> np.ndarray:
    if representation == SKELETON:
        return np.array([skeleton_features(p.question, p.titles) for p in pairs], dtype=np.float64)
    if representation == QUESTION:
        from sglang_specsot.models.embedding import SentenceEmbedder

        return (embedder or SentenceEmbedder()).encode([p.question for p in pairs]).numpy().astype(np.float64)
    raise ValueError(f"representation={representation!r} is not one of {REPRESENTATIONS}")


def fit(x: np.ndarray, y: np.ndarray, l2: float, threshold: float, standardize: bool, name: str) -> LinearHead:
    """A head over raw vectors; standardization (skeleton numbers) is folded into its weights."""
    mean = x.mean(0) if standardize else np.zeros(x.shape[1])
    scale = x.std(0) if standardize else np.ones(x.shape[1])
    scale = np.where(scale > 0, scale, 1.0)
    head = fit_head((x - mean) / scale, y, l2, threshold)
    weights = np.array(head.weights) / scale
    return LinearHead(tuple(float(w) for w in weights), float(head.bias - weights @ mean), threshold, name)


def loo_probabilities(x: np.ndarray, y: np.ndarray, l2: float, standardize: bool) -> np.ndarray:
    out = np.zeros(len(y))
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        out[i] = fit(x[keep], y[keep], l2, 0.5, standardize, "loo").probability(x[i])
    return out


def auc(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """P(a random loss scores above a random win or tie), ties counted half (Mann-Whitney)."""
    pos, neg = probabilities[labels == 1], probabilities[labels == 0]
    if not len(pos) or not len(neg):
        raise ValueError("AUC needs both losses and non-losses among the labels")
    above = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(above / (len(pos) * len(neg)))


def routed(probabilities: np.ndarray, labels: np.ndarray, threshold: float) -> dict:
    """Answers kept on SoT below `threshold`, and the losses they keep, as shares of all."""
    kept = probabilities < threshold
    return {"threshold": threshold, "sot_share": round(float(kept.mean()), 4),
            "loss_share": round(float((labels * kept).sum() / len(labels)), 4)}  # fmt: skip


def choose_threshold(probabilities: np.ndarray, labels: np.ndarray) -> dict:
    rows = [routed(probabilities, labels, t) for t in THRESHOLD_GRID]
    meeting = [r for r in rows if r["loss_share"] <= MAX_LOSS_SHARE]
    if meeting:
        return max(meeting, key=lambda r: r["sot_share"])
    return min(rows, key=lambda r: (r["loss_share"], -r["sot_share"]))


def train(dirs: Sequence[str | Path], out: Path = QUALITY_HEAD_PATH, embedder=None) -> dict:
    """Score every candidate, choose by the rule, and write the chosen head (or none)."""
    pairs = load_pairs(dirs)
    y = np.array([p.loss for p in pairs], dtype=np.float64)
    grid = []
    for representation in REPRESENTATIONS:
        x = features(pairs, representation, embedder)
        for l2 in L2_GRID:
            p = loo_probabilities(x, y, l2, representation == SKELETON)
            grid.append({"representation": representation, "l2": l2, "auc": round(auc(p, y), 4),
                         **choose_threshold(p, y)})  # fmt: skip
    report = {"pairs": len(pairs), "losses": int(y.sum()), "grid": grid, "chosen": None, "out": None}
    counting = [g for g in grid if g["auc"] >= MIN_AUC]
    if counting:
        chosen = max(counting, key=lambda g: g["auc"])  # max keeps the first of equals
        report["chosen"], report["out"] = chosen, str(out)
        out.write_text(_head(pairs, y, chosen, [str(d) for d in dirs], embedder).to_json() + "\n")
    return report


def _head(pairs, y, chosen: dict, dirs: list[str], embedder) -> LinearHead:
    representation = chosen["representation"]
    name = SKELETON_FEATURES if representation == SKELETON else EMBEDDING_NAME
    x = features(pairs, representation, embedder)
    head = fit(x, y, chosen["l2"], chosen["threshold"], representation == SKELETON, name)
    provenance = {"trained_on": dirs, "pairs": len(pairs), "losses": int(y.sum()),
                  "features": list(FEATURE_NAMES) if representation == SKELETON else name,
                  "leave_one_out": chosen, "selection": SELECTION,
                  "command": "python -m sglang_specsot.models.quality_router train " + " ".join(dirs)}  # fmt: skip
    return LinearHead(head.weights, head.bias, head.threshold, head.embedding, provenance)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sglang_specsot.models.quality_router")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("train", help="score the candidates by leave-one-out, choose, write the head")
    cmd.add_argument("dirs", nargs="+", help="bench e2e folders with SoT forced, plain and judge.jsonl")
    cmd.add_argument("--out", type=Path, default=QUALITY_HEAD_PATH)
    args = parser.parse_args(argv)
    report = train(args.dirs, args.out)
    for row in report["grid"]:  # the command's report: stdout
        sys.stdout.write(json.dumps(row) + "\n")
    verdict = report["chosen"] or f"no candidate reaches leave-one-out AUC {MIN_AUC}: no head written"
    sys.stdout.write(json.dumps({"pairs": report["pairs"], "losses": report["losses"], "chosen": verdict,
                                 "out": report["out"]}) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
