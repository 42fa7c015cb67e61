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
        # The tail's own "and" is not one more item (it hid the whole series before).
        ("Compare bubble sort, merge sort, quick sort and heap sort in terms of speed and memory use.",
         ("bubble sort", "merge sort", "quick sort", "heap sort")),
        ("Compare Python, Java, and Rust for web servers and scripts.", ("Python", "Java", "Rust")),
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
