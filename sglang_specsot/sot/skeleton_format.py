"""The skeleton's numbered-points format as a small state machine over decoded text.

A skeleton in this format is lines "N. words" with N = 1, 2, 3... (the "1." is usually the
assistant pre-fill), at most `max_points` points of at most `max_point_words` words and
`max_point_chars` characters, then end-of-turn: no prose after the list. `SkeletonFormat`
reads text and says which kinds of text may come next (`Allowed`); a token-level adapter
(`sglang_specsot.serving.skeleton_constraint`) turns that into a logit mask. Plain Python.

Points are kept to text that `parse_skeleton` reads back exactly as written: words start
with a letter or digit and hold letters, digits, "-" or "'" after a letter, and "," at the
end. A point may end when it is new (its `point_key` differs from earlier points'), or when
it can no longer grow into a new one, once (`MAX_REPEATED_POINTS`): the parser then drops it
as a repeat, so the machine does not count it, and it rejects a plan with more repeats. Every finished text parses as a plan of its counted points.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from sglang_specsot.sot.config import DEFAULT_CONFIG, SoTConfig
from sglang_specsot.sot.prompts import SKELETON_PREFILL
from sglang_specsot.sot.skeleton import MAX_REPEATED_POINTS
from sglang_specsot.sot.text import point_key

DIGITS = "0123456789"
JOINERS = "-'"  # only between a letter and the next letter or digit: "long-term", "don't"
COMMA = ","  # only at the end of a word
# Points `parse_skeleton` drops as preamble when they stand alone (skeleton._is_preamble).
_PREAMBLE_KEYS = frozenset({"skeleton", "outline"})

# Modes of the machine: where in a line the next character goes.
_LINE, _NUMBER, _DOT, _GAP, _SPACE, _WORD, _DEAD = range(7)


class Piece(IntEnum):
    """A class of token text; `classify_piece` maps a token's text to one (or None)."""

    NUMBER = 0  # digits only: a list number, or digits inside a word ("8", "19")
    DOT = 1  # "." right after a list number
    WORD = 2  # word text that continues the current word ("ing", "Keep", "3D", "s,")
    JOIN = 3  # word text that starts with "-" or "'" ("-term", "'t", "-")
    COMMA = 4  # ","
    SPACE_WORD = 5  # " " + word text starting with a letter or digit: the next word
    NEWLINE = 6  # "\n"
    END = 7  # end of text (EOS / end of turn); never text, the adapter maps token ids


# Pieces that add to the current point's text, so the character budget applies to them.
WORD_PIECES = frozenset({Piece.NUMBER, Piece.WORD, Piece.JOIN, Piece.COMMA, Piece.SPACE_WORD})


@dataclass(frozen=True, slots=True)
class Allowed:
    """What may come next: a piece of a class in `pieces`, within the limits below."""

    pieces: frozenset[Piece]
    # The point's character budget left: a WORD_PIECES piece needs `piece_need` <= this.
    max_chars: int = 0
    # While a list number is typed: the digits still to type. A NUMBER piece must then be
    # a prefix of it (and the budget does not apply). Empty: NUMBER is digits in a word.
    number_rest: str = ""


def piece_need(text: str) -> int:
    """Characters of budget a word piece uses: its length, plus one for a trailing joiner
    (a joiner needs a letter or digit after it, or the point could not end)."""
    return len(text) + (1 if text.endswith(tuple(JOINERS)) else 0)


def classify_piece(text: str) -> Piece | None:
    """The class of a token's text, or None for text the format never allows."""
    if text == ".":
        return Piece.DOT
    if text == "\n":
        return Piece.NEWLINE
    if text and all(ch in DIGITS for ch in text):
        return Piece.NUMBER
    body = text[1:] if text.startswith(" ") else text
    if not _valid_word_text(body):
        return None
    if body is not text:
        return Piece.SPACE_WORD if _is_alnum(body[0]) else None
    if body[0] in JOINERS:
        return Piece.JOIN
    return Piece.COMMA if body == COMMA else Piece.WORD


def _is_letter(ch: str) -> bool:
    return ch.isalpha()


def _is_alnum(ch: str) -> bool:
    return ch in DIGITS or ch.isalpha()


def _valid_word_text(body: str) -> bool:
    """Word characters in a valid order; the first one's fit is the machine's to judge."""
    if not body:
        return False
    prev = ""
    for i, ch in enumerate(body):
        if prev == COMMA:
            return False  # a comma ends its word
        if ch in JOINERS:
            if i > 0 and not _is_letter(prev):
                return False
        elif ch != COMMA and not _is_alnum(ch):
            return False
        elif ch == COMMA and i > 0 and not _is_alnum(prev):
            return False
        prev = ch
    return True


class SkeletonFormat:
    """The format's state after some text; `feed` more text, ask `allowed`, `copy` to branch."""

    __slots__ = ("config", "_mode", "_number", "_typed", "_words", "_chars", "_last",
                 "_point", "_keys", "_repeats", "_letters", "_digits")  # fmt: skip

    def __init__(self, config: SoTConfig = DEFAULT_CONFIG, prefill: str = SKELETON_PREFILL):
        """Start at the beginning of the skeleton and read the pre-filled text."""
        self.config = config
        self._mode = _LINE
        self._number = 1  # the point being written, or the next one at a line start
        self._typed = ""  # digits of `_number` typed so far
        self._words = 0  # words of the current point
        self._chars = 0  # characters of the current point, its leading space excluded
        self._last = ""  # the current point's last character
        self._point = ""
        self._keys: tuple[str, ...] = ()  # point_key of every finished point that counts
        self._repeats = 0  # finished points that repeat an earlier one (the parser drops them)
        self._letters = 0  # over all text read: parse_skeleton rejects mostly-digit text
        self._digits = 0
        if not self.feed(prefill):
            raise ValueError(
                f"prefill={prefill!r} is not the start of a numbered skeleton; pre-fill "
                f"with {SKELETON_PREFILL!r} (or nothing)"
            )

    def copy(self) -> SkeletonFormat:
        other = SkeletonFormat.__new__(SkeletonFormat)
        for name in SkeletonFormat.__slots__:
            setattr(other, name, getattr(self, name))
        return other

    @property
    def points(self) -> int:
        """Finished points that count: repeats and lone preamble words do not."""
        return len(self._keys)

    @property
    def dead(self) -> bool:
        """The text read so far left the format (nothing but the end may follow)."""
        return self._mode == _DEAD

    # -- reading text ------------------------------------------------------------------------

    def feed(self, text: str) -> bool:
        """Read `text`; False (and the state is dead) as soon as a character breaks the format."""
        for ch in text:
            if self._mode == _DEAD or not self._step(ch):
                self._mode = _DEAD
                return False
        return self._mode != _DEAD

    def _step(self, ch: str) -> bool:
        if ch in DIGITS:
            self._digits += 1
        elif ch.isalpha():
            self._letters += 1
        mode = self._mode
        if mode in (_LINE, _NUMBER):
            return self._step_number(ch)
        if mode == _DOT:
            return self._advance(ch == ".", _GAP)
        if mode == _GAP:
            return self._advance(ch == " ", _SPACE)
        if mode == _SPACE:
            return self._step_word_start(ch)
        return self._step_word(ch)

    def _advance(self, ok: bool, mode: int) -> bool:
        if ok:
            self._mode = mode
        return ok

    def _step_number(self, ch: str) -> bool:
        target = str(self._number)
        if ch not in DIGITS or self._number > self.config.max_points:
            return False
        if not target.startswith(self._typed + ch):
            return False
        self._typed += ch
        self._mode = _DOT if self._typed == target else _NUMBER
        return True

    def _step_word_start(self, ch: str) -> bool:
        if not _is_alnum(ch) or self._room() < 1:
            return False
        self._words += 1
        self._mode = _WORD
        self._append(ch)
        return True

    def _step_word(self, ch: str) -> bool:
        last, room = self._last, self._room()
        if ch == "\n":
            ok = self._can_end_point()
            if ok:
                self._finish_point()
            return ok
        if ch == " ":  # needs room for itself and the next word's first character
            ok = last not in JOINERS and self._words < self.config.max_point_words and room >= 2
        elif last == COMMA:
            ok = False  # a comma ends its word
        elif ch in JOINERS:
            ok = _is_letter(last) and room >= 2  # and room for the letter or digit it needs
        elif ch == COMMA:
            ok = _is_alnum(last) and room >= 1
        else:
            ok = _is_alnum(ch) and room >= 1
        if ok:
            self._append(ch)
            self._mode = _SPACE if ch == " " else _WORD
        return ok

    def _append(self, ch: str) -> None:
        self._point += ch
        self._chars += 1
        self._last = ch

    def _room(self) -> int:
        return self.config.max_point_chars - self._chars

    def _finish_point(self) -> None:
        if self._is_new():
            self._keys += (point_key(self._point),)
        elif point_key(self._point) in self._keys:
            self._repeats += 1
        self._number += 1
        self._mode, self._typed, self._words, self._chars = _LINE, "", 0, 0
        self._last, self._point = "", ""

    # -- what may come next ------------------------------------------------------------------

    def _is_new(self) -> bool:
        """The current point counts: `parse_skeleton` keeps it as a point of its own."""
        key = point_key(self._point)
        return bool(key) and key not in self._keys and key not in _PREAMBLE_KEYS

    def _can_grow(self) -> bool:
        """Some word text still fits: another character, or a space and a new word."""
        room = self._room()
        grows_word = self._last != COMMA and room >= 1
        return grows_word or (self._words < self.config.max_point_words and room >= 2)

    def _can_end_point(self) -> bool:
        """The current point may end here: it is new, or it can no longer become new (the
        parser then drops it; ending beats a model stuck at its limits)."""
        if self._mode != _WORD or self._last in JOINERS:
            return False
        if self._is_new():
            return True
        repeat_allowed = point_key(self._point) not in self._keys or self._repeats < MAX_REPEATED_POINTS
        return repeat_allowed and not self._can_grow()

    def can_end(self) -> bool:
        """The text read so far is a finished skeleton: end of text may come now."""
        if self._mode == _LINE:
            points = self.points
        elif self._can_end_point():
            points = self.points + self._is_new()
        else:
            return False
        return points >= self.config.min_points and self._letters >= self._digits

    def allowed(self) -> Allowed:
        """The classes of text that may come next; a dead text may only end.

        Rarely nothing fits: after a repeated point on the last line allowed, with too few
        points counted to end, say. The token-level adapter then ends the text.
        """
        end = {Piece.END} if self.can_end() or self._mode == _DEAD else set()
        mode, room = self._mode, self._room()
        if mode in (_LINE, _NUMBER):
            if self._number > self.config.max_points:
                return Allowed(frozenset(end))
            rest = str(self._number)[len(self._typed) :]
            return Allowed(frozenset({Piece.NUMBER} | end), number_rest=rest)
        if mode == _DOT:
            return Allowed(frozenset({Piece.DOT}))
        if mode == _GAP:
            # The leading space of a point is not part of its text: one extra character.
            return Allowed(frozenset({Piece.SPACE_WORD}), max_chars=room + 1)
        if mode == _SPACE:  # only after text split inside a piece: " " then the word
            return Allowed(frozenset({Piece.WORD, Piece.NUMBER}), max_chars=room)
        if mode == _WORD:
            return Allowed(frozenset(self._word_pieces() | end), max_chars=room)
        return Allowed(frozenset(end))

    def _word_pieces(self) -> set[Piece]:
        last = self._last
        if last in JOINERS:
            return {Piece.WORD, Piece.NUMBER}
        pieces = {Piece.NEWLINE} if self._can_end_point() else set()
        if self._words < self.config.max_point_words:
            pieces.add(Piece.SPACE_WORD)
        if last == COMMA:
            return pieces
        pieces |= {Piece.WORD, Piece.NUMBER, Piece.COMMA}
        if _is_letter(last):
            pieces.add(Piece.JOIN)
        return pieces

    def accepts(self, text: str) -> bool:
        """`text` read from here is a finished skeleton (this state is left unchanged)."""
        state = self.copy()
        return state.feed(text) and state.can_end()
