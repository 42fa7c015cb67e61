"""The loop finder: a repeating tail is cut to one copy; ordinary repetition is left alone."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_specsot.sot import merge_answer
from sglang_specsot.sot.loops import MIN_LOOP_WORDS, WATCH_EVERY_CHARS, LoopWatch, cut_loop, find_loop
from sglang_specsot.sot.phases import GenResult, ended_by

CLAUSE = "which would increase the number of people who had died from the plague, "


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("The plague spread fast, " + CLAUSE * 4 + "which would",
         "The plague spread fast, which would increase the number of people who had died from the plague"),
        ("Tip. " + "Drink water. " * 8, "Tip. Drink water."),
        ("a b c d e f " * 3 + "a b", "a b c d e f"),
        ("ha " * 30, "ha"),
    ],
)  # fmt: skip
def test_a_repeating_tail_is_cut_to_one_copy(text, kept):
    assert cut_loop(text) == (kept, True)


@pytest.mark.parametrize(
    "text",
    [
        "Sleep well. Eat well. Move more. Drink water and rest.",
        "very very very good",  # style, too short to be a loop
        CLAUSE * 2,  # two copies: not yet a loop
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",  # layout
        "",
        "1. First. 2. Second. 3. Third. 4. Fourth. 5. Fifth. 6. Sixth.",
    ],
)
def test_ordinary_text_is_not_a_loop(text):
    assert find_loop(text) is None and cut_loop(text) == (text, False)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400), st.lists(st.sampled_from(["go", "on", "and", "so", "forth,"]), min_size=1, max_size=6))
def test_cutting_keeps_a_prefix_and_leaves_no_loop(prefix, unit):
    text = prefix + " " + " ".join(unit * (MIN_LOOP_WORDS + 3))
    cut, looped = cut_loop(text)
    assert looped and text.startswith(cut)
    assert find_loop(cut) is None or len(cut) < len(text)


def test_the_merge_cuts_a_looping_branch_and_says_so():
    merged = merge_answer(["Spread", "Cure"], {0: "It spread fast, " + CLAUSE * 5, 1: "None was found."})
    assert merged.points[0].expansion.endswith("died from the plague")
    assert "cut a repeating loop" in merged.points[0].repairs
    assert merged.text.count("which would") == 1


@pytest.mark.parametrize(
    ("text", "finish", "ended"),
    [(CLAUSE * 5, "length", "loop"), (CLAUSE * 5, "stop", "loop"), ("Short.", "length", "budget"),
     ("Short.", "stop", "stop"), ("Short.", "abort", "abort")],
)  # fmt: skip
def test_why_a_generation_ended(text, finish, ended):
    assert ended_by(GenResult(text, 1, 1, finish)) == ended


def _stream(text: str, size: int = 5):
    return [text[i : i + size] for i in range(0, len(text), size)]


def test_the_watch_sees_a_loop_soon_after_its_third_copy():
    watch = LoopWatch()
    text = "The plague spread along trade routes, " + CLAUSE * 6
    fired_at = next(i for i, piece in enumerate(_stream(text)) if watch.feed(piece))
    seen = len("".join(_stream(text)[: fired_at + 1]))
    third_copy_ends = len("The plague spread along trade routes, ") + 3 * len(CLAUSE)
    assert seen <= third_copy_ends + WATCH_EVERY_CHARS + 5
    assert watch.text == text[:seen] and find_loop(watch.text) is not None


@pytest.mark.parametrize(
    "text",
    ["Regular exercise strengthens the heart, lowers blood pressure and improves sleep. " * 1
     + "It also lifts mood, because activity releases endorphins that ease stress.",
     "1. First. 2. Second. 3. Third. 4. Fourth. 5. Fifth. 6. Sixth."],
)  # fmt: skip
def test_the_watch_stays_quiet_on_ordinary_text(text):
    watch = LoopWatch()
    assert not any(watch.feed(piece) for piece in _stream(text, 3))


def test_a_branch_ended_for_its_loop_reads_as_a_loop():
    assert ended_by(GenResult("Short.", 1, 1, "loop")) == "loop"
