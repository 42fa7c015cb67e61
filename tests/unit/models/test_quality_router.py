"""The quality router's trainer: judged pairs read as the runner plans them, the rule applied."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sglang_specsot.models import quality_router as qr
from sglang_specsot.sot.quality_gate import SKELETON, SKELETON_FEATURES, load_quality_gate

LONG = "1. Plan ahead\n2. Sleep well\n3. Eat well\n4. Move daily\n5. Read more\n6. Rest often"
SHORT = "1. Plan ahead\n2. Sleep well\n3. Eat well"


def write_run(folder, rows, *, source="router_train"):
    """rows: (question, skeleton_text, verdict, path); a bench e2e folder with blind verdicts."""
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"max_tokens": 384}))
    questions, cells, judged = [], [], []
    for qid, (question, skeleton, verdict, path) in enumerate(rows):
        questions.append({"id": qid, "question": question, "sot_suitable": True, "source": source})
        cells.append({"question_id": qid, "config": "SoT-server", "path": path, "skeleton_text": skeleton,
                      "token_parts": {"skeleton": 20}})  # fmt: skip
        cells.append({"question_id": qid, "config": "plain", "path": "normal", "skeleton_text": ""})
        judged.append({"question_id": qid, "config": "SoT-server", "verdict": verdict})
    for name, data in (("questions", questions), ("cells", cells), ("judge", judged)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    return folder


class ConstantEmbedder:
    def encode(self, texts):
        return torch.ones(len(texts), 4) / 2


def test_pairs_are_read_as_the_runner_plans_them_and_labelled_by_the_verdict(tmp_path):
    run = write_run(tmp_path / "run", [
        ("How can I stay healthy?", LONG, "loss", "sot"),
        ("How can I stay calm?", SHORT, "win", "sot"),
        ("How can I stay warm?", SHORT, "tie", "sot"),
        ("How can I stay dry?", SHORT, "loss", "normal"),  # SoT did not answer: nothing to gate
        ("What if humans could fly?", SHORT, "loss", "sot"),  # a changed premise: vetoed before the gate
    ])  # fmt: skip
    pairs = qr.load_pairs([run])
    assert [(p.question_id, p.loss, len(p.titles)) for p in pairs] == [(0, 1, 6), (1, 0, 3), (2, 0, 3)]
    assert pairs[1].titles == ("Plan ahead", "Sleep well", "Eat well")


def test_held_out_questions_and_unjudged_runs_are_refused(tmp_path):
    held = write_run(tmp_path / "held", [("How can I sleep?", SHORT, "win", "sot")], source="router_holdout2")
    with pytest.raises(ValueError, match="held-out"):
        qr.load_pairs([held])
    empty = write_run(tmp_path / "empty", [("How can I sleep?", SHORT, "win", "normal")])
    with pytest.raises(ValueError, match="blind-score"):
        qr.load_pairs([empty])


def test_auc_counts_ranked_pairs_and_ties_half():
    labels = np.array([1, 1, 0, 0])
    assert qr.auc(np.array([0.9, 0.8, 0.2, 0.1]), labels) == 1.0
    assert qr.auc(np.array([0.1, 0.2, 0.8, 0.9]), labels) == 0.0
    assert qr.auc(np.array([0.5, 0.5, 0.5, 0.5]), labels) == 0.5
    with pytest.raises(ValueError, match="both"):
        qr.auc(np.array([0.1, 0.2]), np.array([1, 1]))


def test_the_threshold_keeps_most_on_sot_within_the_loss_share_else_fewest_losses():
    p = np.array([0.1, 0.2, 0.35, 0.45, 0.55, 0.65, 0.8, 0.9, 0.95, 0.99])
    y = np.array([0, 0, 0, 1, 0, 1, 1, 1, 1, 1])
    chosen = qr.choose_threshold(p, y)  # t=0.5 keeps 4 with 1 loss (10%); t=0.6 keeps 5, still 1 loss
    assert chosen == {"threshold": 0.6, "sot_share": 0.5, "loss_share": 0.1}
    all_losses = qr.choose_threshold(np.full(10, 0.2), np.ones(10))  # none meets 10%: fewest kept
    assert all_losses == {"threshold": 0.3, "sot_share": 1.0, "loss_share": 1.0}


def test_standardization_is_folded_into_the_weights():
    rng = np.random.default_rng(0)
    x = rng.normal(5.0, 3.0, (30, 5))
    y = (x[:, 0] + rng.normal(0, 1, 30) > 5).astype(float)
    head = qr.fit(x, y, 0.1, 0.5, True, SKELETON_FEATURES)
    mean, scale = x.mean(0), x.std(0)
    reference = qr.fit_head((x - mean) / scale, y, 0.1, 0.5)
    for row in x[:5]:
        assert head.probability(row) == pytest.approx(reference.probability((row - mean) / scale), rel=1e-9)


def test_a_plan_that_predicts_the_loss_ships_a_skeleton_head(tmp_path):
    rows = [(f"How can I improve habit {i}?", LONG if i % 2 else SHORT, "loss" if i % 2 else "win", "sot")
            for i in range(16)]  # fmt: skip
    out = tmp_path / "head.json"
    report = qr.train([write_run(tmp_path / "run", rows)], out, embedder=ConstantEmbedder())
    assert report["pairs"] == 16 and report["losses"] == 8
    assert report["chosen"]["representation"] == SKELETON and report["chosen"]["auc"] == 1.0
    gate = load_quality_gate(out)
    assert gate.on_plan("How can I improve habit 99?", LONG.replace("1. ", "").split("\n")[:6]).worse
    assert not gate.on_plan("How can I improve habit 99?", ["Plan ahead", "Sleep well", "Eat well"]).worse
    assert gate.head.provenance["pairs"] == 16


def test_nothing_that_ranks_losses_ships_no_head(tmp_path):
    rows = [(f"How can I improve habit {i}?", SHORT, "loss" if i % 2 else "tie", "sot") for i in range(12)]
    out = tmp_path / "head.json"
    report = qr.train([write_run(tmp_path / "run", rows)], out, embedder=ConstantEmbedder())
    assert report["chosen"] is None and not out.exists()
    assert all(row["auc"] < qr.MIN_AUC for row in report["grid"])
