"""The EAGLE-3 training prompt set (data/eagle3_prompts.jsonl), without a model: its format,
its topic-level split, no repeat of a benchmark question, and that its builder rewrites it."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict

import pytest

from sglang_specsot.data import DATA_DIR
from sglang_specsot.data import build_eagle3_prompts as builder

PROMPTS = DATA_DIR / "eagle3_prompts.jsonl"
KINDS = ("code", "science", "skills", "compare", "writing", "short")
THIRD_PARTY = DATA_DIR.parent.parent / "third_party" / "sot-router-labels"
BENCHMARK_FILES = [
    DATA_DIR / f"{name}.jsonl"
    for name in ("vicuna80", "router_train", "router_traps", "router_holdout", "router_holdout2")
] + sorted(DATA_DIR.glob("enumerated_asks*.jsonl"))
EXTERNAL_FILES = [THIRD_PARTY / "lima.jsonl", THIRD_PARTY / "wizardlm.jsonl"]  # in a checkout only


def normalized(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return [json.loads(line) for line in PROMPTS.read_text(encoding="utf-8").splitlines()]


def test_rows_have_the_format_and_ids_in_file_order(rows):
    assert len(rows) >= 500
    assert [row["id"] for row in rows] == list(range(len(rows)))
    for row in rows:
        assert set(row) == {"id", "kind", "topic", "split", "prompt"}
        assert row["kind"] in KINDS and row["split"] in ("train", "heldout")
        assert isinstance(row["topic"], str) and row["topic"].strip()
        assert isinstance(row["prompt"], str) and row["prompt"].strip() == row["prompt"]
    assert set(Counter(row["kind"] for row in rows)) == set(KINDS)
    assert len({normalized(row["prompt"]) for row in rows}) == len(rows), "a prompt is repeated"


def test_whole_topics_are_held_out(rows):
    splits = defaultdict(set)
    for row in rows:
        splits[(row["kind"], row["topic"])].add(row["split"])
    assert all(len(s) == 1 for s in splits.values()), [t for t, s in splits.items() if len(s) > 1]
    heldout = sum(row["split"] == "heldout" for row in rows) / len(rows)
    assert 0.05 <= heldout <= 0.20
    for kind in KINDS:  # every kind has topics on both sides
        assert {s for (k, _), (s,) in splits.items() if k == kind} == {"train", "heldout"}, kind


def test_no_prompt_repeats_a_benchmark_question(rows):
    files = BENCHMARK_FILES + [path for path in EXTERNAL_FILES if path.is_file()]
    assert len(BENCHMARK_FILES) >= 10 and all(path.is_file() for path in BENCHMARK_FILES)
    questions = {
        normalized(json.loads(line)["question"])
        for path in files
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip()
    }
    repeats = [row["prompt"] for row in rows if normalized(row["prompt"]) in questions]
    assert not repeats


def test_the_builder_rewrites_the_file_byte_for_byte(rows):
    built = builder.build_rows()
    assert built == rows
    assert builder.render(built).encode("utf-8") == PROMPTS.read_bytes()
    assert builder.OUT == PROMPTS
