"""Find a text's repeating tail: a small model's branch that says one clause over and over.

A branch that loops runs until its budget and buries its point under copies of one clause
("which would increase the number of people who had died from the plague, which would ...").
`find_loop` says where such a tail starts so the merge can keep one copy, and the trace can
say the branch ended in a loop; `LoopWatch` finds it while the branch streams, so a backend
can end the branch there instead of at its budget. Words are compared case- and punctuation-insensitively.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WORD = re.compile(r"\S+")
_EDGE_PUNCT = ".,;:!?\"'()[]*_`"

MAX_PERIOD_WORDS = 40  # longest repeated unit looked for
MIN_COPIES = 3  # the unit, then at least two more copies (a partial last copy counts)
MIN_LOOP_WORDS = 12  # shorter repeats ("very, very, very") are style, not a loop
WATCH_EVERY_CHARS = 24  # a loop is >= 12 words: checking every few words finds it soon enough


@dataclass(frozen=True, slots=True)
class Loop:
    """A repeating tail: the text up to `keep_chars` holds one copy of the unit."""

    keep_chars: int  # cut here to keep everything before the repetition and one copy
    period_words: int
    repeated_words: int  # words after the first copy that only repeat it


def find_loop(text: str) -> Loop | None:
    """The loop at the end of `text`, or None when its tail does not repeat."""
    spans = [m.span() for m in _WORD.finditer(text)]
    words = [text[a:b].strip(_EDGE_PUNCT).lower() for a, b in spans]
    best: Loop | None = None
    for period in range(1, min(MAX_PERIOD_WORDS, len(words) // MIN_COPIES) + 1):
        run = _repeat_run(words, period)
        if run < (MIN_COPIES - 1) * period or run + period < MIN_LOOP_WORDS:
            continue
        if not any(w.isalnum() or any(c.isalnum() for c in w) for w in words[-period:]):
            continue  # a rule of dashes or a row of table bars is layout, not a loop
        # Keep the first copy: it ends `run` words before the end.
        keep = spans[len(words) - run - 1][1]
        if best is None or run > best.repeated_words:
            best = Loop(keep, period, run)
    return best


def _repeat_run(words: list[str], period: int) -> int:
    """How many trailing words equal the word `period` places before them, consecutively."""
    run = 0
    for i in range(len(words) - 1, period - 1, -1):
        if words[i] != words[i - period]:
            break
        run += 1
    return run


def cut_loop(text: str) -> tuple[str, bool]:
    """`text` with a repeating tail cut to one copy of its unit, and whether it was cut."""
    loop = find_loop(text)
    if loop is None:
        return text, False
    return text[: loop.keep_chars].rstrip(" ,;:"), True


class LoopWatch:
    """A generation's text as it streams, and whether its tail has started to loop.

    `find_loop` reads the whole text, so it runs once per `WATCH_EVERY_CHARS` new characters
    rather than per token; a loop is found at most that much later.
    """

    def __init__(self) -> None:
        self.text = ""
        self._checked = 0  # len(self.text) at the last check

    def feed(self, piece: str) -> bool:
        """Add `piece`; True once the text ends in a loop."""
        self.text += piece
        if len(self.text) - self._checked < WATCH_EVERY_CHARS:
            return False
        self._checked = len(self.text)
        return find_loop(self.text) is not None
