"""The skeleton format state machine: table cases, and properties against `parse_skeleton`."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_specsot.sot import SoTConfig, parse_skeleton
from sglang_specsot.sot.skeleton_format import (
    WORD_PIECES,
    Allowed,
    Piece,
    SkeletonFormat,
    classify_piece,
    piece_need,
)
from sglang_specsot.sot.skeleton import SkeletonPoint, merge_same_ideas
from sglang_specsot.sot.text import point_key

SMALL = SoTConfig(min_points=2, max_points=3, max_point_words=3, max_point_chars=20)
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize(
    "text, accepted",
    [
        (" Keep regular bedtime\n2. Limit screens", True),
        (" Keep regular bedtime\n2. Limit screens\n", True),  # a trailing newline is clean
        (" Sleep well\n2. Eat, drink\n3. Move", True),
        (" Don't panic\n2. Long-term plans", True),
        (" Get 8 hours\n2. Use 3D maps", True),
        (" Sleep\n2. Eat\n3. Move\n4. Rest", False),  # a fourth point is over max_points
        (" One two three four\n2. Eat", False),  # four words is over max_point_words
        (" Abcdefghijklmnopqrstu\n2. Eat", False),  # 21 characters is over max_point_chars
        (" Sleep", False),  # one point is fewer than min_points: no clean end yet
        (" Sleep\n3. Eat", False),  # numbers must count up by one
        (" Sleep\n2. sleep", False),  # the same point twice (parse_skeleton would merge them)
        (" Sleep\n2. Eat.", False),  # no sentence punctuation inside the list
        (" Sleep\n2. Eat\nThat is all", False),  # no prose after the list
        (" Sleep\n2. Eat\n\n", False),
        ("Sleep\n2. Eat", False),  # "1." is followed by a space
        (" Sleep\n2.  Eat", False),  # and by exactly one
        (" Sleep\n2. -Eat", False),  # words start with a letter or digit
        (" Step 1-go\n2. Eat", False),  # "-" only after a letter: this would read as a marker
        (" Sleep-\n2. Eat", False),  # and never ends a point
        (" Sleep,now\n2. Eat", False),  # a comma ends its word
        (" Skeleton\n2. Eat", False),  # parse_skeleton drops a lone "Skeleton" as preamble
        (" 1234 5678\n2. Go", False),  # mostly digits would read as no skeleton at all
    ],
)
def test_table(text, accepted):
    assert SkeletonFormat(SMALL).accepts(text) is accepted
    if accepted:
        parse = parse_skeleton(text, SMALL, prefill="1.")
        assert parse.is_plan and len(parse.points) == text.rstrip("\n").count("\n") + 1


@pytest.mark.parametrize(
    "text, piece",
    [(".", Piece.DOT), ("\n", Piece.NEWLINE), ("12", Piece.NUMBER), ("ing", Piece.WORD),
     ("3D", Piece.WORD), ("s,", Piece.WORD), ("-term", Piece.JOIN), ("'t", Piece.JOIN),
     (",", Piece.COMMA), (" Keep", Piece.SPACE_WORD), (" 8", Piece.SPACE_WORD),
     (" ", None), ("\n\n", None), (".\n", None), (" -x", None), ("3-4", None), ("a,b", None),
     ("Sleep.", None), ("<|im_end|>", None), ("", None), (" a", Piece.SPACE_WORD)],
)  # fmt: skip
def test_classify_piece(text, piece):
    assert classify_piece(text) is piece


def test_allowed_at_each_stage():
    fmt = SkeletonFormat(SMALL)  # read "1."
    assert fmt.allowed() == Allowed(frozenset({Piece.SPACE_WORD}), max_chars=21)
    assert fmt.feed(" Sleep")
    after_word = fmt.allowed()
    assert after_word.pieces == frozenset(
        {Piece.WORD, Piece.NUMBER, Piece.JOIN, Piece.COMMA, Piece.SPACE_WORD, Piece.NEWLINE}
    )  # one point is not a skeleton yet: no END
    assert after_word.max_chars == 15
    assert fmt.feed("\n")
    assert fmt.allowed() == Allowed(frozenset({Piece.NUMBER}), number_rest="2")
    assert fmt.feed("2") and fmt.allowed() == Allowed(frozenset({Piece.DOT}))
    assert fmt.feed(". Eat\n3. Move")
    assert Piece.END in fmt.allowed().pieces and Piece.NEWLINE in fmt.allowed().pieces
    assert fmt.feed("\n")
    assert fmt.allowed() == Allowed(frozenset({Piece.END}))  # max_points reached


def test_two_digit_numbers_are_typed_digit_by_digit():
    config = SoTConfig(max_points=12)
    text = "".join(f" P{i}x\n{i + 1}." for i in range(1, 10))  # up to "10."
    fmt = SkeletonFormat(config)
    assert fmt.feed(text[:-3]) and fmt.allowed().number_rest == "10"
    assert fmt.feed("1") and fmt.allowed().number_rest == "0"
    assert fmt.feed("0.") and not fmt.dead


def test_dead_text_may_only_end_and_a_bad_prefill_is_refused():
    fmt = SkeletonFormat(SMALL)
    assert not fmt.feed(" Sleep!") and fmt.dead
    assert fmt.allowed() == Allowed(frozenset({Piece.END}))
    assert SkeletonFormat(SMALL, prefill="").allowed().number_rest == "1"
    with pytest.raises(ValueError, match="prefill"):
        SkeletonFormat(SMALL, prefill="Sure!")


def test_a_word_at_the_limits_may_still_end():
    # room for "-" needs one more character after it; the comma may end the point
    fmt = SkeletonFormat(SoTConfig(max_point_chars=3, max_point_words=1))
    assert fmt.feed(" ab")
    assert fmt.allowed().max_chars == 1 and not _spec_allows(fmt.allowed(), "-")
    assert fmt.feed(",") and Piece.NEWLINE in fmt.allowed().pieces
    assert Piece.SPACE_WORD not in fmt.allowed().pieces


def test_a_repeat_that_cannot_grow_may_end_but_does_not_count():
    roomy = SkeletonFormat(SoTConfig(max_point_chars=6, max_point_words=1))
    assert roomy.feed(" Sleep\n2. Sleep")  # a repeat with room for one more letter: grow it
    assert Piece.NEWLINE not in roomy.allowed().pieces and Piece.WORD in roomy.allowed().pieces
    config = SoTConfig(max_point_chars=5, max_point_words=1)
    fmt = SkeletonFormat(config)
    assert fmt.feed(" Sleep\n2. Sleep")  # no room left: it may end, as a repeat
    assert Piece.NEWLINE in fmt.allowed().pieces
    assert Piece.END not in fmt.allowed().pieces and fmt.points == 1  # one point counts so far
    assert fmt.feed("\n3. Eat") and fmt.can_end() and fmt.points == 1  # "Eat" is still open
    parse = parse_skeleton(" Sleep\n2. Sleep\n3. Eat", config, prefill="1.")
    assert parse.texts == ("Sleep", "Eat")  # the parser drops the repeat too


def test_nothing_fits_after_a_repeat_on_the_last_line_with_too_few_points():
    fmt = SkeletonFormat(SoTConfig(max_points=2, max_point_chars=5, max_point_words=1))
    assert fmt.feed(" Sleep\n2. Sleep\n")
    assert fmt.allowed() == Allowed(frozenset())  # the token-level adapter then ends the text


# -- properties ---------------------------------------------------------------------------------

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\u00e9\u00fc\u00df\u0436\u4e2d\ufb01"
_CHARS = _LETTERS + "0123456789-',. \n:*#()!"
_PIECES = st.one_of(
    st.sampled_from([".", "\n", " ", ",", "-", "'", "'s", "-term", " Keep", " 8", "ing", "1", "2",
                     "3", "4", "10", "\n\n", " skeleton", " Outline", " sleep", " Sleep"]),
    st.text(alphabet=_LETTERS + "0123456789", min_size=1, max_size=6),
    st.text(alphabet=_LETTERS, min_size=1, max_size=6).map(lambda s: " " + s),
    st.text(alphabet=_CHARS, min_size=1, max_size=4),
)  # fmt: skip
_CONFIGS = st.builds(
    lambda lo, extra, words, chars: SoTConfig(min_points=lo, max_points=lo + extra,
                                              max_point_words=words, max_point_chars=chars),
    st.integers(2, 3), st.integers(0, 9), st.integers(1, 5), st.integers(1, 30),
)  # fmt: skip


def _spec_allows(allowed: Allowed, piece: str) -> bool:
    """What the token-level adapter allows, from the `Allowed` spec alone."""
    cls = classify_piece(piece)
    if cls not in allowed.pieces:
        return False
    if cls is Piece.NUMBER and allowed.number_rest:
        return allowed.number_rest.startswith(piece)
    return cls not in WORD_PIECES or piece_need(piece) <= allowed.max_chars


_GUIDED = {
    Piece.NUMBER: st.text(alphabet="0123456789", min_size=1, max_size=2),
    Piece.DOT: st.just("."),
    Piece.WORD: st.text(alphabet=_LETTERS + "0123456789", min_size=1, max_size=5),
    Piece.JOIN: st.sampled_from(["-", "'", "'s", "-term", "-a,"]),
    Piece.COMMA: st.just(","),
    Piece.SPACE_WORD: st.text(alphabet=_LETTERS + "0123", min_size=1, max_size=5).map(lambda s: " " + s),
    Piece.NEWLINE: st.just("\n"),
}


def _guided_piece(draw, fmt: SkeletonFormat) -> str | None:
    """A piece of a class the state allows (None: the walk ends); it may still not fit."""
    allowed = fmt.allowed()
    if not allowed.pieces:
        return None  # nothing fits (see test_nothing_fits_after_a_repeat_on_the_last_line...)
    cls = draw(st.sampled_from(sorted(allowed.pieces)))
    if cls is Piece.END:
        return None
    if cls is Piece.NUMBER and allowed.number_rest:
        return allowed.number_rest[: draw(st.integers(1, len(allowed.number_rest)))]
    return draw(_GUIDED[cls])


@st.composite
def walks(draw) -> tuple[SoTConfig, str, SkeletonFormat, list[str]]:
    """A random walk through the format, half guided by `allowed()` and half from a pool of
    pieces; a piece is kept when the machine reads it. Returns (config, text, state, tried)."""
    config = draw(_CONFIGS)
    fmt, text, tried = SkeletonFormat(config), "", []
    for _ in range(draw(st.integers(0, 60))):
        piece = _guided_piece(draw, fmt) if draw(st.booleans()) else draw(_PIECES)
        if piece is None:
            break
        tried.append(piece)
        trial = fmt.copy()
        if trial.feed(piece):
            fmt, text = trial, text + piece
    return config, text, fmt, tried


@PROPERTY
@given(walks())
def test_every_finished_text_parses_as_the_plan_it_wrote(walk):
    config, text, fmt, _ = walk
    if not fmt.can_end():
        return  # only finished texts are claims; the next property covers the others
    parse = parse_skeleton(text, config, prefill="1.")
    assert parse.is_plan, (text, parse)
    assert parse.long_points == ()
    assert all("duplicate" in n or "preamble" in n or "same idea" in n for n in parse.notes)
    lines = ("1." + text).rstrip("\n").split("\n")
    written, keys = [], set()
    for i, line in enumerate(lines, start=1):
        assert line.startswith(f"{i}. ")
        point = line[len(f"{i}. ") :].rstrip(",")
        if point_key(point) not in keys | {"skeleton", "outline"}:  # what the parser drops
            written.append(point)
            keys.add(point_key(point))
    # Titles of one idea in other words are merged too, as far as the plan keeps its minimum.
    merged = merge_same_ideas([SkeletonPoint(w) for w in written], (), config.min_points)[0]
    assert parse.texts == tuple(p.text for p in merged) and len(written) <= config.max_points
    assert all(len(p.split()) <= config.max_point_words and len(p) <= config.max_point_chars for p in written)


@PROPERTY
@given(st.data())
def test_any_accepted_text_parses_as_a_plan_within_bounds(data):
    config = data.draw(_CONFIGS)
    lines = data.draw(st.lists(st.text(alphabet=_CHARS, max_size=12), min_size=1, max_size=5))
    text = " " + lines[0] + "".join(f"\n{i}. {line}" for i, line in enumerate(lines[1:], start=2))
    if SkeletonFormat(config).accepts(text):
        parse = parse_skeleton(text, config, prefill="1.")
        assert parse.is_plan and len(parse.points) <= len(lines) <= config.max_points
        assert all(len(p.text.split()) <= config.max_point_words for p in parse.points)


STATES = ["", " Keep", " Keep,", " Long-", " Don'", " Get 8", " Sleep\n", " Sleep\n2", " Sleep\n2.",
          " Sleep\n2. Eat", " Sleep\n2. Eat\n3. Go", " Sleep\n2. Sleep", " Abcdefghijklmnopqrs"]
PIECES = [".", "\n", ",", "-", "'", "'s", "-term", "-a,", " Keep", " 8", "ing", "1", "2", "3", "10",
          "3D", "a,", " a-", "s,", "b", " Sleep", " x"]  # fmt: skip


@pytest.mark.parametrize("text", STATES)
def test_allowed_agrees_with_reading_each_piece(text):
    fmt = SkeletonFormat(SMALL)
    assert fmt.feed(text)
    for piece in PIECES:
        assert _spec_allows(fmt.allowed(), piece) == fmt.copy().feed(piece), (text, piece)


@PROPERTY
@given(walks(), st.lists(_PIECES, min_size=1, max_size=20))
def test_allowed_agrees_with_reading_the_piece(walk, pieces):
    _, _, fmt, tried = walk
    allowed = fmt.allowed()
    for piece in tried + pieces:
        if classify_piece(piece) is None:
            continue  # never allowed by the adapter, whatever feed says of a prefix
        assert _spec_allows(allowed, piece) == fmt.copy().feed(piece), (piece, allowed)


@PROPERTY
@given(walks())
def test_end_is_allowed_exactly_when_the_text_is_finished_or_dead(walk):
    _, _, fmt, _ = walk
    assert (Piece.END in fmt.allowed().pieces) == (fmt.can_end() or fmt.dead)
