"""The Skeleton-of-Thought authors' labelled sets in third_party/: what the README says of them."""

from __future__ import annotations

import json

import pytest

from sglang_specsot.sot import agreement
from sglang_specsot.sot.agreement import EXTERNAL_DIR, labelled_set_path, load_labelled


@pytest.mark.parametrize(("name", "n", "suitable"), [("sot_lima", 1030, 371), ("sot_wizardlm", 215, 58)])
def test_counts_match_the_papers_less_the_rows_left_out(name, n, suitable):
    rows = load_labelled(name)
    assert len(rows) == n and sum(r.sot_suitable for r in rows) == suitable


def test_wizardlm_leaves_out_its_repeat_and_the_vicuna_questions():
    ids = [json.loads(line)["id"] for line in (EXTERNAL_DIR / "wizardlm.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 215 and not {63, 109, 134} & set(ids)
    vicuna = {r.question.strip().lower().rstrip(".") for r in load_labelled("vicuna80")}
    wizard = [r.question.strip().lower().rstrip(".") for r in load_labelled("sot_wizardlm")]
    assert len(set(wizard)) == len(wizard) and not vicuna & set(wizard)


def test_the_independent_check_shares_no_question_with_the_training_sets():
    wizard = {r.question.strip().lower() for r in load_labelled("sot_wizardlm")}
    for name in ("sot_lima", "router_train", "router_traps", "router_holdout"):
        assert not wizard & {r.question.strip().lower() for r in load_labelled(name)}, name


def test_a_missing_external_set_says_where_it_lives(monkeypatch, tmp_path):
    monkeypatch.setattr(agreement, "EXTERNAL_DIR", tmp_path)
    with pytest.raises(ValueError, match="third_party/sot-router-labels/.*non-commercial"):
        labelled_set_path("sot_wizardlm")
