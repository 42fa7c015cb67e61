"""The report's reader table (bench.reader_report) and coverage without the shared opening."""

from __future__ import annotations

import pytest

from sglang_specsot.bench.quality import assess
from sglang_specsot.bench.reader_report import markdown, reader_per_question, reader_rows
from sglang_specsot.bench.reading import visible_words
from tests.unit.bench.conftest import cell, sot_cell
from tests.unit.bench.test_report import WordEmbedder, cells_of

OPENING = "Here are some tips for better sleep:"
PLAIN = f"{OPENING}\n\n1. **Schedule**: Go to bed at ten.\n\n2. **Screens**: Turn phones off early.\n\n3. **Caffeine**: Skip coffee after noon."
SOT = (f"{OPENING}\n\n1. Keep a schedule is crucial for sleep. Go to bed at ten every night.\n"
       "2. Limit screens. Limiting screens is important for better sleep. This includes:\n   - Phones off early.")
SKELETON = "1. Keep a schedule\n2. Limit screens"
QUESTION = "How can I get better sleep?"


def cells():
    return cells_of(cell(1, "plain", answer=PLAIN),
                    sot_cell(1, "SoT-server", 1.0, answer=SOT, skeleton_text=SKELETON),
                    cell(2, "plain", answer="Ten hours."), cell(2, "SoT-server", answer="Ten hours."))  # fmt: skip


def test_reader_row_counts_sot_answers_and_keeps_routed_normal_apart():
    (row,) = reader_rows(cells(), {1: QUESTION, 2: "How long should I sleep?"}, [])
    assert (row.config, row.sot_answers, row.routed_normal, row.points) == ("SoT-server", 1, 1, 2)
    assert row.glued_titles == 1  # "Keep a schedule is crucial"
    assert row.restating_points == 2 and row.one_item_lead_ins == 1
    assert row.points_vs_items == "q1 2/3"
    assert row.words_ratio_median == pytest.approx(visible_words(SOT) / visible_words(PLAIN))
    assert row.words_ratio_min == row.words_ratio_max == row.words_ratio_median  # one SoT answer
    table = markdown([row])
    assert "| SoT-server | 1 | 1 |" in table and "q1 2/3" in table


def test_coverage_without_the_shared_opening_is_lower_than_with_it():
    quality = {(q.question_id, q.config): q for q in assess(cells(), {1: QUESTION}, WordEmbedder())}
    sot, routed = quality[(1, "SoT-server")], quality[(2, "SoT-server")]
    # The copied opening covers the plain opening: 3 of 4 plain sentences with it (the opening,
    # bed at ten, phones off early), 2 of 3 without; caffeine is covered by neither.
    assert sot.normal_covered == pytest.approx(3 / 4) and sot.normal_covered_body == pytest.approx(2 / 3)
    assert routed.normal_covered_body == routed.normal_covered  # nothing shared to remove
    (row,) = reader_rows(cells(), {1: QUESTION}, list(quality.values()))
    assert row.covered_body == pytest.approx(2 / 3) and row.covered_routed == routed.normal_covered


def test_per_question_readings_list_each_point():
    (one,) = reader_per_question(cells(), {1: QUESTION})
    assert (one["question_id"], one["config"], one["points"], one["normal_items"]) == (1, "SoT-server", 2, 3)
    assert [p["glued"] for p in one["per_point"]] == [True, False] and one["one_item_lead_ins"] == 1
