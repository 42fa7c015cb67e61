from __future__ import annotations

import pytest

from sglang_specsot.bench.quality import Quality, assess, controls
from sglang_specsot.bench.report import greedy_equality, lossless_speed, markdown, per_question, speedups, summarize
from tests.unit.bench.conftest import FAILED, cell, sot_cell


def cells_of(*cells):
    return {c.key: c for c in cells}


CELLS = cells_of(
    cell(1, "plain", 10.0, answer="A b c."), cell(2, "plain", 8.0, suitable=False, answer="Plain two."),
    sot_cell(1, "SoT-server", 5.0, answer="Same."), sot_cell(1, "SpecSoT-server", 2.5, answer="Same."),
    cell(2, "SpecSoT-server", 4.0, suitable=False, answer="Other."),
    cell(2, "SoT-server", 0.0, suitable=False, status=FAILED, reason="HTTP 500"),
)  # fmt: skip


def test_speedup_is_plain_latency_over_the_configurations_on_the_same_question():
    assert speedups(CELLS, "SpecSoT-server") == {1: 4.0, 2: 2.0}
    assert speedups(CELLS, "SoT-server") == {1: 2.0}  # a failed cell has no ratio


def test_summary_rows_per_subset_with_failures_counted():
    rows = {(r.config, r.subset): r for r in summarize(CELLS, [])}
    spec = rows[("SpecSoT-server", "all")]
    assert spec.speedup == pytest.approx(8 ** 0.5)  # geometric mean of 4 and 2
    assert spec.ok == 2 and spec.sot_share == 0.5 and spec.points == 2 and spec.longest_branch_s == 2.5
    assert rows[("SoT-server", "unsuitable")].failed == 1 and rows[("SoT-server", "unsuitable")].ok == 0
    assert rows[("plain", "all")].speedup == 1.0


def test_summary_carries_quality_and_judge_results():
    quality = [Quality(1, "SpecSoT-server", 0.5, 1.0, 0.8, 0.4, 3, 2 / 3)]
    rows = summarize(CELLS, quality, {"SpecSoT-server": {1: "win", 2: "tie"}},
                     calibrated={"SpecSoT-server": {1: "win", 2: "loss"}})
    spec = next(r for r in rows if r.config == "SpecSoT-server" and r.subset == "all")
    assert (spec.normal_covered, spec.cosine, spec.asks_addressed, spec.judge) == (0.5, 0.8, pytest.approx(2 / 3), "1/1/0")
    assert spec.judge_calibrated == "1/0/1"


def test_greedy_equality_counts_identical_answers():
    eq = greedy_equality(CELLS)
    assert eq["SpecSoT-server == SoT-server"] == {"equal": 1, "of": 1, "differ": []}


def test_lossless_speed_compares_time_per_token_not_latency():
    cells = cells_of(
        cell(1, "plain", 10.0, output_tokens=100), cell(1, "SPECSOT", 9.0, output_tokens=100),
        cell(2, "plain", 10.0, output_tokens=100), cell(2, "SPECSOT", 6.0, output_tokens=50),  # shorter, slower per token
        cell(3, "plain", 10.0, output_tokens=100), cell(3, "SPECSOT", 1.0, status=FAILED, reason="HTTP 500"),
        cell(4, "SPECSOT", 5.0, output_tokens=100),  # no plain answer to compare with
    )  # fmt: skip
    speed = lossless_speed(cells)
    assert list(speed) == ["SPECSOT vs plain"]
    got = speed["SPECSOT vs plain"]
    assert got["n"] == 2 and got["per_question"] == {1: pytest.approx(1 / 0.9, abs=1e-4), 2: pytest.approx(1 / 1.2, abs=1e-4)}
    assert got["per_token_speed"] == pytest.approx((1 / 0.9 / 1.2) ** 0.5, abs=1e-4)
    assert (got["min"], got["max"]) == (pytest.approx(0.8333, abs=1e-4), pytest.approx(1.1111, abs=1e-4))


def test_markdown_has_one_line_per_row_and_dashes_for_missing_values():
    rows = summarize(CELLS, [])
    table = markdown(rows).splitlines()
    assert len(table) == 2 + len(rows)
    assert table[0].startswith("| config | subset | ok | failed | speed-up vs plain")
    assert "| - |" in table[2]


def test_per_question_rows_show_what_auto_predicted():
    import dataclasses

    auto = dataclasses.replace(cell(1, "SoT-auto", 9.0), route_latency={"use_sot": False, "ratio": 1.4})
    rows = {r["config"]: r for r in per_question(cells_of(cell(1, "plain", 10.0), auto), [])}
    assert rows["SoT-auto"]["predicted_ratio"] == 1.4 and rows["SoT-auto"]["route_latency"]["use_sot"] is False
    assert "predicted_ratio" not in rows["plain"]


def test_per_question_rows_keep_failures_with_reasons():
    rows = per_question(CELLS, [])
    failed = [r for r in rows if r["status"] == FAILED]
    assert failed == [pytest.approx(failed[0])] and failed[0]["reason"] == "HTTP 500"


class WordEmbedder:
    """Bag-of-words unit vectors: equal texts score 1, texts without shared words 0."""

    def encode(self, texts):
        import torch

        vocab = sorted({w for t in texts for w in t.lower().split()}) or ["_"]
        rows = [[float(w in t.lower().split()) for w in vocab] for t in texts]
        return torch.nn.functional.normalize(torch.tensor(rows) + 1e-9, dim=-1)


def test_assess_scores_each_answer_against_the_plain_one():
    cells = cells_of(cell(1, "plain", answer="Sleep at regular hours. Avoid coffee after noon."),
                     cell(1, "SoT-server", answer="1. Sleep at regular hours.\n2. Keep the room dark."))  # fmt: skip
    quality = {q.config: q for q in assess(cells, {1: "Compare coffee, tea and water."}, WordEmbedder())}
    sot = quality["SoT-server"]
    assert sot.normal_covered == 0.5 and sot.answer_covered == 0.5
    assert sot.length_ratio == pytest.approx(10 / 8) and sot.asks == 3  # "1." and "2." count as words
    assert quality["plain"].cosine == pytest.approx(1.0)


def test_controls_score_known_halves_and_other_questions_with_both_measures():
    first = "Sleep at regular hours. Avoid coffee after noon. Keep the room dark. Get up at seven."
    second = "Cook rice in salted water. Rinse the rice first. Let it rest covered."
    cells = cells_of(cell(1, "plain", answer=first), cell(2, "plain", answer=second),
                     cell(3, "plain", suitable=False, answer="Unsuitable questions are left out."))  # fmt: skip
    by = {c.name: c for c in controls(cells, WordEmbedder())}
    # The first half of each answer's sentences: 2 of 4 and 1 of 3 sentences, verbatim.
    assert by["first half"].questions == 2 and by["first half"].matched == pytest.approx((2 / 4 + 1 / 3) / 2)
    # The other suitable question's answer shares no sentence with this one's.
    assert by["other question"].covered == 0.0 and by["other question"].matched == 0.0
    assert controls(cells_of(cell(1, "plain", answer=first)), WordEmbedder()) == []  # one question: nothing to swap


def test_points_that_end_cut_are_counted_per_configuration_and_per_question():
    from sglang_specsot.bench.goals import check

    cut = "1. Sleep. Rest helps.\n2. Food. For example, the National Institutes of Health (NIH)\n3. Move. Tips:"
    whole = "1. Sleep. Rest helps.\n2. Food. Tips:\n   - **Rice**: cheap.\n   - **Beans**: filling."
    cells = cells_of(cell(1, "plain"), sot_cell(1, "SpecSoT-server", 1.0, answer=cut),
                     cell(2, "plain"), sot_cell(2, "SpecSoT-server", 1.0, answer=whole),
                     cell(3, "plain"), cell(3, "SpecSoT-server", answer="Answered normally, so not counted"))  # fmt: skip
    rows = {(r.config, r.subset): r for r in summarize(cells, [])}
    spec = rows[("SpecSoT-server", "all")]
    assert (spec.mid_sentence_points, spec.lead_in_points) == (1, 1)
    assert (rows[("plain", "all")].mid_sentence_points, rows[("plain", "all")].lead_in_points) == (None, None)
    assert "| mid-sentence points | lead-ins cut (empty or one item) |" in markdown(list(rows.values())).splitlines()[0]
    by_question = {(r["question_id"], r["config"]): r for r in per_question(cells, [])}
    assert by_question[(1, "SpecSoT-server")]["cut_points"] == 2
    assert by_question[(2, "SpecSoT-server")]["cut_points"] == 0
    assert "cut_points" not in by_question[(3, "SpecSoT-server")]  # the normal path
    goals = {g.name: g for g in check(list(rows.values()))}
    goal = goals["SpecSoT-server points ending mid-sentence or on an empty lead-in"]
    assert (goal.value, goal.met) == (2, False)


def test_answer_length_is_each_questions_tokens_over_the_normal_answers_with_a_goal():
    from sglang_specsot.bench.goals import check
    from sglang_specsot.bench.report import token_ratios

    cells = cells_of(
        cell(1, "plain", output_tokens=100), cell(2, "plain", output_tokens=20), cell(3, "plain", output_tokens=300),
        sot_cell(1, "SoT-server", 5.0), sot_cell(2, "SoT-server", 5.0),  # 40 tokens each
        sot_cell(3, "SoT-server", 5.0, status=FAILED),
    )  # fmt: skip
    assert token_ratios(cells, "SoT-server") == {1: 0.4, 2: 2.0}  # a failed cell has no ratio
    row = next(r for r in summarize(cells, []) if (r.config, r.subset) == ("SoT-server", "all"))
    assert (row.tokens_ratio_median, row.tokens_ratio_max) == (pytest.approx(1.2), 2.0)
    assert [r["tokens_ratio"] for r in per_question(cells, []) if r["config"] == "SoT-server"] == [0.4, 2.0, None]
    goals = {g.name: g.met for g in check(summarize(cells, []))}
    assert goals["SoT-server tokens / normal answer's, median"] is True  # 1.2 lies in 0.7-1.3
    assert goals["SoT-server tokens / normal answer's, largest"] is False  # 2.0 > 1.6
