"""Items a question names: found in a series of three or more, and added to a plan that misses them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_specsot.sot import SoTConfig, parse_skeleton
from sglang_specsot.sot.asks import cover_asks, covered, enumerated_items

SORTS = ("Compare the sorting algorithms bubble sort, quick sort, merge sort, heap sort, insertion sort "
         "and selection sort in C++ with code.")  # fmt: skip


@pytest.mark.parametrize(
    ("question", "items"),
    [
        (SORTS, ("bubble sort", "quick sort", "merge sort", "heap sort", "insertion sort", "selection sort")),
        ("Write a movie review for a new science fiction film, discussing its plot, characters, and special effects.",
         ("plot", "characters", "special effects")),
        ("Which is better for me: tea, coffee, or water?", ("tea", "coffee", "water")),
        ("Write about big cats, including lions, tigers and leopards.", ("lions", "tigers", "leopards")),
        ("List the pros of solar, wind and hydro power for a small town.", ("solar", "wind", "hydro power")),
        # The tail's own "and" is not one more item (read as one, it would hide the whole series).
        ("Compare bubble sort, merge sort, quick sort and heap sort in terms of speed and memory use.",
         ("bubble sort", "merge sort", "quick sort", "heap sort")),
        ("Compare Python, Java, and Rust for web servers and scripts.", ("Python", "Java", "Rust")),
        # An "and" before the series is not a series' ("pros and cons of ...").
        ("What are the pros and cons of living in a big city, a suburb or the countryside?",
         ("big city", "a suburb", "the countryside")),  # as wide as the widest other item
        # The series is the subject: the verb after it ends the last item, the auxiliary before
        # it is no part of the first.
        ("How did the printing press, the steam engine and the telephone change everyday life?",
         ("the printing press", "the steam engine", "the telephone")),
        ("How do photosynthesis, cellular respiration and fermentation differ?",
         ("photosynthesis", "cellular respiration", "fermentation")),
        ("What role did iron, coal and oil play in industrialization?", ("iron", "coal", "oil")),
        ("Explain how the heart, the lungs and the kidneys keep the body healthy.",
         ("the heart", "the lungs", "the kidneys")),
        ("What made ancient Egypt, ancient Greece and ancient China powerful?",
         ("ancient Egypt", "ancient Greece", "ancient China")),
        # Without an auxiliary, a final word is the item's ("hybrid work" is no verb here).
        ("Compare remote work, office work and hybrid work.", ("remote work", "office work", "hybrid work")),
        # A second series after the first: the items are the last one's.
        ("Describe the climate, wildlife and people of the Sahara, the Amazon rainforest and Antarctica.",
         ("the Sahara", "the Amazon rainforest", "Antarctica")),
        ("Sort these words: pear, apple, mango, banana.", ("pear", "apple", "mango", "banana")),  # no "and"
    ],
)  # fmt: skip
def test_a_named_series_is_found(question, items):
    assert enumerated_items(question) == items


@pytest.mark.parametrize(
    "question",
    [
        "What are the main differences between Python and JavaScript?",  # two items: aspects plan well
        "How can I improve my time management skills?",
        "How do vaccinations protect individuals and communities, and what is herd immunity?",  # clauses
        "I like apples, pears, and plums, but what should I eat for breakfast today?",
        "Write a blog post about a trip to Hawaii, highlighting cultural experiences and attractions.",
        # A clause after a two-item "such as": no series, and the clause is no item (Vicuna q35).
        "How can you assess the credibility of a source of information, such as a news article or blog "
        "post, without relying solely on the reputation of the author or publisher?",
        "",
        # One article before bare words: adjectives of one noun, not things.
        "Write a short, friendly and clear welcome message for new members of a hiking club.",
        "Which is healthier, brown rice or white rice?",  # a copula's complement is no item
    ],
)
def test_no_series_no_items(question):
    assert enumerated_items(question) == ()


def test_coverage_uses_each_items_own_words():
    items = ("bubble sort", "quick sort", "merge sort")
    assert covered(items, "Bubble sort swaps neighbours; merge sort splits in halves.") == [True, False, True]


def test_a_plan_missing_named_items_gets_them_as_points():
    parse = parse_skeleton(" Bubble sort\n2. Quick sort\n3. Time complexity")
    got = cover_asks(parse, SORTS)
    assert got.texts == ("Bubble sort", "Quick sort", "Time complexity", "merge sort", "heap sort",
                         "insertion sort", "selection sort")  # fmt: skip
    assert any("added points the question names" in note for note in got.notes)
    assert all(covered(enumerated_items(SORTS), " ".join(got.texts)))


def test_named_items_outrank_other_points_at_the_cap():
    parse = parse_skeleton(" Bubble sort\n2. History\n3. Stability\n4. Memory use")
    got = cover_asks(parse, SORTS, SoTConfig(max_points=7))
    assert got.texts == ("Bubble sort", "History", "quick sort", "merge sort", "heap sort", "insertion sort",
                         "selection sort")  # fmt: skip


def test_a_complete_plan_or_no_plan_is_left_alone():
    complete = parse_skeleton(" Plot\n2. Characters\n3. Special effects\n4. Verdict")
    question = "Review the film, discussing its plot, characters, and special effects."
    assert cover_asks(complete, question) is complete
    direct = parse_skeleton("Just one answer.")
    assert cover_asks(direct, SORTS) is direct


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_gives_items_without_error(question):
    items = enumerated_items(question)
    assert all(isinstance(i, str) and i for i in items)
    assert len(covered(items, question)) == len(items)


def test_derived_parse_is_the_questions_items_as_points():
    from sglang_specsot.sot.asks import derived_parse

    parse = derived_parse("Describe the main causes of the French Revolution, the American Revolution and the Russian Revolution.")
    assert parse.is_plan and parse.texts == ("The French Revolution", "The American Revolution", "The Russian Revolution")
    assert derived_parse("How can I improve my time management skills?") is None
    assert derived_parse("Compare tea and coffee.") is None  # two items plan well by aspect
    assert derived_parse("Compare bubble sort, merge sort, quick sort and heap sort.", SoTConfig(max_points=3)) is None
    assert derived_parse("Compare bubble sort, merge sort and quick sort.", SoTConfig(derive_skeleton=False)) is None


def test_derive_skeleton_must_be_a_bool():
    with pytest.raises(ValueError, match="derive_skeleton=1 must be True or False"):
        SoTConfig(derive_skeleton=1)


@pytest.mark.parametrize("name", ["enumerated_asks", "enumerated_asks2", "enumerated_asks3"])
def test_the_extractor_agrees_with_the_labels_it_was_tuned_on(name):
    """The sets the extractor was written against (enumerated_asks4 is the check set: see
    data/README.md; `python -m sglang_specsot.sot.asks eval` scores it, no test pins it)."""
    from sglang_specsot.data import DATA_DIR, load_questions
    from sglang_specsot.sot.asks import evaluate_items

    result = evaluate_items(load_questions(DATA_DIR / f"{name}.jsonl"))
    assert result.wrong == () and result.exact == result.n


def test_items_agree_ignores_order_case_and_articles_and_takes_alternatives():
    from sglang_specsot.sot.asks import items_agree

    assert items_agree(["Wind", "solar", "the nuclear power"], ["solar|solar power", "wind", "nuclear power"])
    assert not items_agree(["solar", "wind"], ["solar", "wind", "nuclear power"])
    assert not items_agree(["solar", "solar", "wind"], ["solar", "wind", "nuclear power"])  # each label once
    assert items_agree([], [])


def test_item_eval_names_a_bad_label_and_counts_each_kind_of_miss():
    from sglang_specsot.sot.asks import evaluate_items

    with pytest.raises(ValueError, match="needs \"items\", a list of non-empty strings"):
        evaluate_items([{"question": "Compare A, B and C.", "items": "A, B, C"}])
    rows = [
        {"question": "Compare tea, coffee and water.", "items": ["tea", "coffee", "water"]},
        {"question": "Write a short, warm and clear note for a friend.", "items": ["short", "warm", "clear"]},
        {"question": "Compare tea, coffee and water.", "items": []},
    ]
    got = evaluate_items(rows)
    assert (got.n, got.exact, got.missed, got.false_series) == (3, 1, 1, 1)
    assert got.wrong[0][1] == () and got.wrong[1][1] == ("tea", "coffee", "water")


def test_item_eval_command_prints_disagreements_then_one_json_line(tmp_path, capsys):
    import json

    from sglang_specsot.sot.asks import main

    path = tmp_path / "asks.jsonl"
    path.write_text(json.dumps({"question": "Compare tea, coffee and water.", "items": ["tea", "coffee"]}) + "\n")
    main(["eval", str(path)])
    lines = capsys.readouterr().out.splitlines()
    assert "found ['tea', 'coffee', 'water'], labelled ['tea', 'coffee']" in lines[0]
    assert json.loads(lines[-1]) == {"n": 1, "exact": 0.0, "false_series": 0, "missed": 0}
    with pytest.raises(SystemExit, match="usage: python -m sglang_specsot.sot.asks eval"):
        main(["score", str(path)])
    with pytest.raises(SystemExit, match="error: .*nope.jsonl"):
        main(["eval", str(tmp_path / "nope.jsonl")])
