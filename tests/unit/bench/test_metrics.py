from __future__ import annotations

import pytest

from sglang_specsot.bench.metrics import (
    LOSS, TIE, WIN, calibrated_verdict, combine_verdicts, completeness, coverage, length_ratio, matched_coverage,
    parse_verdict, sentences,
)  # fmt: skip


def test_sentences_strip_numbering_and_drop_fragments():
    text = "1. **Set goals**: write them down now.\n2. Plan.\nThen review weekly. It helps you a lot!"
    assert sentences(text) == ["Set goals: write them down now.", "Then review weekly.", "It helps you a lot!"]


def test_coverage_counts_rows_whose_best_match_reaches_the_threshold():
    assert coverage([[0.9, 0.1], [0.2, 0.3], [0.6, 0.0]], threshold=0.6) == pytest.approx(2 / 3)
    assert coverage([]) is None
    assert coverage([[]]) == 0.0  # a sentence with nothing to match is not covered


def test_matched_coverage_lets_each_covering_sentence_cover_one_sentence():
    # One sentence like both of the normal answer's: `coverage` counts both, one to one only one.
    assert coverage([[0.9], [0.8]]) == 1.0
    assert matched_coverage([[0.9], [0.8]]) == 0.5
    # The matching is maximal, not greedy: row 0 could take column 0 or 1, row 1 only 0.
    assert matched_coverage([[0.9, 0.7], [0.8, 0.1]]) == 1.0
    assert matched_coverage([[0.9, 0.1], [0.2, 0.3], [0.6, 0.0]], threshold=0.6) == pytest.approx(1 / 3)
    assert matched_coverage([]) is None
    assert matched_coverage([[], []]) == 0.0


def test_length_ratio_in_words():
    assert length_ratio("a b c", "a b c d e f") == 0.5
    assert length_ratio("a", "") is None


def test_completeness_of_an_enumerated_ask():
    question = "Compare Python, Java and Rust for web servers."
    assert completeness(question, "Python is easy. Java is verbose. Rust is fast.") == (3, 1.0)
    n, share = completeness(question, "Python is easy to learn.")
    assert n == 3 and share == pytest.approx(1 / 3)
    assert completeness("How can I sleep better?", "anything") == (0, None)


@pytest.mark.parametrize("reply, verdict", [("A", "A"), (" B.", "B"), ("Tie", "tie"), ("Answer A is better", "A"),
                                            ("neither", None), ("", None)])  # fmt: skip
def test_parse_verdict(reply, verdict):
    assert parse_verdict(reply) == verdict


def test_verdicts_in_both_orders_and_disagreement_is_a_tie():
    assert combine_verdicts("A", "B") == WIN  # SoT preferred as A and as B
    assert combine_verdicts("B", "A") == LOSS
    assert combine_verdicts("A", "A") == TIE  # position bias: the judge picked the first both times
    assert combine_verdicts(None, "B") == TIE
    assert combine_verdicts("tie", "tie") == TIE


def test_calibrated_verdict_cancels_a_judge_that_always_names_the_first_answer():
    # The judge prefers position A by 3 nats whichever answer is there, plus 0.5 for SoT's answer.
    assert calibrated_verdict(3.5, 2.5) == WIN
    assert calibrated_verdict(2.5, 3.5) == LOSS
    assert calibrated_verdict(3.0, 3.0) == TIE  # only position bias
    assert calibrated_verdict(3.05, 2.95) == TIE  # inside the +-0.1 nat band
    assert calibrated_verdict(None, 1.0) == TIE
