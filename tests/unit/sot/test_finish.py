"""AimWatch: a branch past its aimed length ends at its next complete sentence (sot.finish)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_specsot.sot.finish import AimWatch


def feed_all(watch: AimWatch, pieces: list[str], tokens_each: int = 1) -> str | None:
    """The text kept once the watch says the branch may end, or None if it never does."""
    for i, piece in enumerate(pieces, start=1):
        keep = watch.feed(piece, i * tokens_each)
        if keep is not None:
            return watch.text[:keep]
    return None


def test_text_before_the_aim_never_ends_the_branch():
    pieces = ["Sleep well.", " Eat well.", " Move", " every day.", " Rest", " too."]
    assert feed_all(AimWatch(3), pieces) == "Sleep well. Eat well. Move every day."
    assert feed_all(AimWatch(100), pieces) is None


def test_a_sentence_end_needs_what_follows_it():
    watch = AimWatch(1)
    assert watch.feed("It costs 3.", 1) is None  # "3.14" or the end: not known yet
    assert watch.feed("14 dollars.", 2) is None
    assert watch.text[: watch.feed("\n", 3)] == "It costs 3.14 dollars."


@pytest.mark.parametrize("text, kept", [
    ("Steps:\n1. Boil water\n2. Add tea. Then wait.", "Steps:\n1. Boil water\n2. Add tea."),  # markers are no ends
    ("Try fruit, e.g. apples. Or nuts.", "Try fruit, e.g. apples."),  # nor is an abbreviation
    ('He said "stop." Then left.', 'He said "stop."'),  # closing quotes stay with the end
    ("Use **bold.** More.", "Use **bold.**"),
    ("Really? Yes.", "Really?"),
])  # fmt: skip
def test_what_ends_a_sentence(text, kept):
    watch = AimWatch(1)
    pieces = [text[i : i + 3] for i in range(0, len(text), 3)] + [" "]
    assert feed_all(watch, pieces) == kept


@pytest.mark.parametrize("aim", [0, -4, True, 2.5, None])
def test_a_bad_aim_is_refused_naming_it(aim):
    with pytest.raises(ValueError, match=f"aim={aim!r}"):
        AimWatch(aim)


@given(st.lists(st.sampled_from(["Word", " word", ".", " ", "\n", "3", "e.g", "?", "**"]), max_size=40),
       st.integers(1, 20))  # fmt: skip
def test_the_kept_text_is_a_prefix_that_ends_a_sentence(pieces, aim):
    watch = AimWatch(aim)
    kept = feed_all(watch, pieces)
    if kept is not None:
        assert watch.text.startswith(kept) and kept.rstrip("\"'\u201d\u2019)]*_")[-1] in ".!?\u2026"
