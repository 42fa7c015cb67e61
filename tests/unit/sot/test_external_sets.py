"""The third-party labelled sets in third_party/: what their READMEs say of them."""

from __future__ import annotations

import json

import pytest

from sglang_specsot.sot import agreement
from sglang_specsot.sot.agreement import THIRD_PARTY_DIR, labelled_set_path, load_labelled


@pytest.mark.parametrize(("name", "n", "suitable"), [("sot_lima", 1030, 371), ("sot_wizardlm", 215, 58)])
def test_counts_match_the_papers_less_the_rows_left_out(name, n, suitable):
    rows = load_labelled(name)
    assert len(rows) == n and sum(r.sot_suitable for r in rows) == suitable


def test_wizardlm_leaves_out_its_repeat_and_the_vicuna_questions():
    ids = [json.loads(line)["id"] for line in (THIRD_PARTY_DIR / "sot-router-labels" / "wizardlm.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 215 and not {63, 109, 134} & set(ids)
    vicuna = {r.question.strip().lower().rstrip(".") for r in load_labelled("vicuna80")}
    wizard = [r.question.strip().lower().rstrip(".") for r in load_labelled("sot_wizardlm")]
    assert len(set(wizard)) == len(wizard) and not vicuna & set(wizard)


def test_the_independent_check_shares_no_question_with_the_training_sets():
    wizard = {r.question.strip().lower() for r in load_labelled("sot_wizardlm")}
    for name in ("sot_lima", "router_train", "router_traps", "router_holdout"):
        assert not wizard & {r.question.strip().lower() for r in load_labelled(name)}, name


def test_a_missing_external_set_says_where_it_lives(monkeypatch, tmp_path):
    monkeypatch.setattr(agreement, "THIRD_PARTY_DIR", tmp_path)
    with pytest.raises(ValueError, match="third_party/sot-router-labels/.*non-commercial"):
        labelled_set_path("sot_wizardlm")


def _dolly_rows() -> list[dict]:
    path = THIRD_PARTY_DIR / "dolly-categories" / "dolly.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_dolly_labels_are_its_categories_mapped_as_the_readme_says():
    rows = _dolly_rows()
    counts = {}
    for row in rows:
        counts[row["category"]] = counts.get(row["category"], 0) + 1
        assert row["sot_suitable"] is (row["category"] == "brainstorming"), row
    assert counts == {"open_qa": 154, "classification": 98, "brainstorming": 72, "information_extraction": 71,
                      "closed_qa": 70, "summarization": 49, "creative_writing": 25}  # fmt: skip
    assert [r["id"] for r in rows] == list(range(539)) and len(load_labelled("dolly_categories")) == 539
    # Context-bound categories (and only those) came with a passage, which the set leaves out.
    with_context = {"closed_qa", "information_extraction", "summarization"}
    assert all(r["has_context"] is (r["category"] in with_context) for r in rows)
    windows = sorted({(r["window"], r["i"]) for r in rows})
    assert len(windows) == 539 and len({w for w, _ in windows}) == 39


def test_dolly_shares_one_question_with_the_other_sets():
    dolly = [r["question"].strip().lower() for r in _dolly_rows()]
    assert len(set(dolly)) == len(dolly)
    for name in ("sot_lima", "sot_wizardlm", "vicuna80", "router_train", "router_traps", "router_holdout", "router_holdout2"):
        shared = set(dolly) & {r.question.strip().lower() for r in load_labelled(name)}
        # One common question was written for router_train too; both label it unsuitable.
        assert shared == ({"why is the sky blue?"} if name == "router_train" else set()), name


def test_a_missing_dolly_set_names_its_licence(monkeypatch, tmp_path):
    monkeypatch.setattr(agreement, "THIRD_PARTY_DIR", tmp_path)
    with pytest.raises(ValueError, match="third_party/dolly-categories/.*CC BY-SA 3.0"):
        labelled_set_path("dolly_categories")
