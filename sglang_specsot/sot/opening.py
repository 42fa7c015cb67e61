"""Whether the normal answer has points to expand, read from its opening line.

The same model answers the same question in very different shapes: one paragraph of 57 tokens,
or an intro ("...offers several benefits, including:") over a list of 300. A SoT answer has
points whatever the normal answer's shape, so on a one-paragraph answer it writes 3-5 times
the normal answer's tokens, and no length the question alone predicts can tell the two apart
(the model's own sampled answers to one question differ as much). The normal answer's first
line can: a list is announced by a line that ends in a colon, or begun at once by an item.

So a server-side SoT answer starts the normal answer beside its skeleton and reads its first
line (`OpeningWatch`): prose continues as the normal answer, and nothing but the skeleton's
row was spent; an announced list stops it, keeps the intro line as the SoT answer's first
line, and the skeleton's points are expanded as usual. The watch is fed the same text by the
backend (which stops the generation) and the runner (which cancels the skeleton), so both read
one verdict. Plain Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PROSE, INTRO, ITEM = "prose", "intro", "item"

# A line that begins a list item: "1." "2)" "-" "*" "+" "•", then a space.
_ITEM_LINE = re.compile(r"\s*(?:\d{1,3}[.)]|[-*+•])\s")
_INTRO_END = (":", "：")  # an ASCII colon, and the full-width one CJK text uses

# The first line's longest reading: an intro is a sentence or two (the 1.5B's intros on the
# tuning questions ended within 179 characters); a first line that runs on past this is prose.
DEFAULT_OPENING_CHARS = 400


@dataclass(frozen=True, slots=True)
class Opening:
    """What the normal answer's first line says: `kind` is PROSE (answer normally), INTRO (a
    list follows; `keep` characters of the text are the intro line, kept as the SoT answer's
    first line) or ITEM (the answer is a list from its first line; nothing is kept)."""

    kind: str
    keep: int = 0
    reason: str = ""

    @property
    def has_points(self) -> bool:
        return self.kind != PROSE


class OpeningWatch:
    """The normal answer's text as it streams, until its first line decides its `Opening`.

    `feed` returns the verdict once it is known (then keeps returning it), else None: at the
    first line break that follows some text, or once `max_chars` have come without one (prose).
    `end` is the verdict of a generation that ended before either (a short answer: prose)."""

    def __init__(self, max_chars: int = DEFAULT_OPENING_CHARS) -> None:
        if not isinstance(max_chars, int) or isinstance(max_chars, bool) or max_chars < 1:
            raise ValueError(f"max_chars={max_chars!r} must be a positive number of characters")
        self.max_chars = max_chars
        self.text = ""
        self.verdict: Opening | None = None

    def feed(self, piece: str) -> Opening | None:
        if self.verdict is None:
            self.text += piece
            self.verdict = read_opening(self.text, self.max_chars)
        return self.verdict

    def end(self) -> Opening:
        if self.verdict is None:
            self.verdict = Opening(PROSE, reason="the normal answer ended within its first line")
        return self.verdict


def read_opening(text: str, max_chars: int = DEFAULT_OPENING_CHARS) -> Opening | None:
    """The verdict on an answer's text so far, or None while its first line is still open."""
    start = len(text) - len(text.lstrip())  # line breaks before any text open no line
    cut = text.find("\n", start)
    if cut < 0 or cut - start > max_chars:
        if len(text) - start > max_chars:
            return Opening(PROSE, reason=f"no line break in the first {max_chars} characters")
        return None
    line = text[start:cut].rstrip()
    if _ITEM_LINE.match(line):
        return Opening(ITEM, 0, "the normal answer begins with a list item")
    if line.endswith(_INTRO_END):
        return Opening(INTRO, start + len(line), "the normal answer announces a list")
    return Opening(PROSE, reason="the normal answer's first line is prose")
