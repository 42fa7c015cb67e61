from __future__ import annotations

import pytest

from sglang_specsot.bench.goals import check, markdown
from sglang_specsot.bench.profile import profiles
from sglang_specsot.bench.report import SUBSETS, summarize
from tests.unit.bench.conftest import cell, sot_cell


def cells_of(*cells):
    return {c.key: c for c in cells}


CELLS = cells_of(
    cell(1, "plain", 12.0, output_tokens=60), cell(1, "NGRAM", 6.0), cell(1, "SoT-server", 0.0, status="failed"),
    sot_cell(1, "SpecSoT-server", 4.0), cell(2, "plain", 8.0, suitable=False), cell(2, "SpecSoT-router", 10.0, suitable=False),
)  # fmt: skip


def test_goals_name_what_is_met_missed_and_not_measured():
    rows = summarize(CELLS, [], {"SpecSoT-server": {1: "loss"}})
    goals = {g.name: g for g in check(rows, judge_counts=True)}
    assert goals["SpecSoT-server vs plain"].value == pytest.approx(3.0) and goals["SpecSoT-server vs plain"].met
    assert goals["SpecSoT-server vs best speculative-only"].value == pytest.approx(1.5)  # 3.0 / NGRAM's 2.0
    assert goals["SpecSoT-server vs SoT-server"].met is None  # SoT-server's cell failed
    assert goals["SpecSoT-server judge (both orders agree)"].met is False  # 0 wins, 1 loss
    assert goals["SpecSoT-router vs plain on unsuitable questions"].met is False  # 0.8x
    assert "| SpecSoT-router vs plain on unsuitable questions | 0.80 | >= 1 | **no** |" in markdown(list(goals.values()))
    # A judge that did not pass its controls measures nothing.
    uncounted = {g.name: g for g in check(rows)}["SpecSoT-server judge (both orders agree)"]
    assert uncounted.met is None and uncounted.value == "0/0/1 (judge without passing controls)"


def test_profile_splits_the_answer_into_skeleton_branches_and_the_rest():
    (row,) = [p for p in profiles(CELLS, SUBSETS) if p.subset == "suitable"]
    # sot_cell: skeleton 0.9 s, branches 1.0-2.0 (10 tokens) and 1.0-3.5 (20 tokens), 4 s in all.
    assert (row.config, row.n) == ("SpecSoT-server", 1)
    assert row.skeleton_share == pytest.approx(0.9 / 4) and row.branch_share == pytest.approx(2.5 / 4)
    assert row.other_share == pytest.approx(0.6 / 4)
    assert row.overlap == pytest.approx(3.5 / 2.5) and row.longest_over_phase == pytest.approx(1.0)
    assert row.branch_tok_s == pytest.approx(30 / 2.5) and row.plain_tok_s == pytest.approx(60 / 12)
    assert row.tokens_vs_plain == pytest.approx(40 / 60)


def test_quality_goals_count_loop_ended_branches_flawed_skeletons_and_the_worst_question():
    from sglang_specsot.bench.quality import Quality
    from sglang_specsot.bench.store import Branch

    looping = (Branch(0, 1.0, 2.0, 10, "stop", "stop"), Branch(1, 1.0, 3.5, 20, "length", "loop"))
    cells = cells_of(
        cell(1, "plain", 12.0), sot_cell(1, "SpecSoT-server", 4.0, skeleton_text="1. Plan\n2. Act\n3. Rest"),
        cell(2, "plain", 12.0),
        sot_cell(2, "SpecSoT-server", 4.0, branches=looping, skeleton_text="1. Sort\n2. ```cpp\n3. Merge"),
    )  # fmt: skip
    quality = [Quality(1, "SpecSoT-server", 0.95, 0.9, 0.9, 1.0, 0, None),
               Quality(2, "SpecSoT-server", 0.5, 0.9, 0.9, 1.0, 0, None)]  # fmt: skip
    (row,) = [r for r in summarize(cells, quality, {}) if r.config == "SpecSoT-server" and r.subset == "suitable"]
    assert row.branch_loops == pytest.approx(0.25) and row.flawed_skeletons == 1
    assert row.min_normal_covered == pytest.approx(0.5)
    assert row.empty_points is None  # neither cell counted its empty points (an older run)
    goals = {g.name: g for g in check([row])}
    assert goals["SpecSoT-server loop-ended branches"].met is False
    assert goals["SpecSoT-server skeletons with code or repeated points"].met is False
    assert goals["SpecSoT-server worst question covers the normal answer"].met is False


def test_the_coverage_ceiling_averages_the_sampled_answers_and_names_questions_below_every_sample():
    from sglang_specsot.bench.goals import ceiling_markdown, coverage_ceiling
    from sglang_specsot.bench.quality import Quality
    from sglang_specsot.bench.report import per_question

    def q(qid, config, covered):  # matched one to one: half as much, to tell the measures apart
        return Quality(qid, config, covered, 0.9, 0.9, 1.0, 0, None, covered / 2)

    cells = cells_of(
        cell(1, "plain", 12.0), cell(1, "plain-sampled", 11.0), cell(1, "plain-sampled-2", 11.0),
        sot_cell(1, "SoT-server", 4.0),
        cell(2, "plain", 8.0), cell(2, "plain-sampled", 9.0), cell(2, "plain-sampled-3", 9.0),
        sot_cell(2, "SoT-server", 4.0),
        cell(3, "plain", 8.0, suitable=False), cell(3, "plain-sampled", 9.0, suitable=False),
    )  # fmt: skip
    quality = [q(1, "plain-sampled", 0.8), q(1, "plain-sampled-2", 0.6), q(1, "SoT-server", 0.7),
               q(2, "plain-sampled", 0.6), q(2, "plain-sampled-3", 0.4), q(2, "SoT-server", 0.3),
               q(3, "plain-sampled", 0.0)]  # fmt: skip
    ceiling = coverage_ceiling(per_question(cells, quality))
    assert (ceiling.questions, ceiling.samples) == (2, 2.0)  # the unsuitable question is left out
    assert ceiling.mean == pytest.approx(0.6) and ceiling.worst == pytest.approx(0.5)
    (sot,) = ceiling.configs
    assert (sot.config, sot.questions) == ("SoT-server", 2)
    assert sot.covered == pytest.approx(0.5) and sot.ceiling == pytest.approx(0.6)
    assert sot.below_every_sample == [2]  # q1's 0.7 is between its samples' 0.6 and 0.8
    assert "| SoT-server | 2 | 0.50 | 0.60 | q2 |" in ceiling_markdown(ceiling)
    assert coverage_ceiling(per_question(CELLS, [])) is None  # no sampled cells
    matched = coverage_ceiling(per_question(cells, quality), "normal_matched")
    assert matched.mean == pytest.approx(0.3) and matched.configs[0].covered == pytest.approx(0.25)
    assert "coverage 1:1 of normal" in ceiling_markdown(matched, "Coverage 1:1")


def test_empty_points_are_a_share_of_the_points_of_the_answers_that_counted_them():
    cells = cells_of(
        cell(1, "plain", 12.0), sot_cell(1, "SpecSoT-server", 4.0, empty_points=1),
        cell(2, "plain", 12.0), sot_cell(2, "SpecSoT-server", 4.0, empty_points=0),
        cell(3, "plain", 12.0), sot_cell(3, "SpecSoT-server", 4.0),  # an older cell: not counted
    )  # fmt: skip
    (row,) = [r for r in summarize(cells, []) if r.config == "SpecSoT-server" and r.subset == "suitable"]
    assert row.empty_points == pytest.approx(1 / 4)  # 1 of the 2 + 2 points counted
