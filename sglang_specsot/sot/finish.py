"""Where a branch that has written its aimed length ends: at its next complete sentence.

Small models keep to "one or two sentences" only roughly (the 1.5B writes one or two more),
so asking is not enough to hold a point near its aim (sot.budget.point_target). A budget at
the aim would cut the point mid-sentence and the merge would then drop the unfinished part.
Instead a backend that streams watches the branch: once it has generated its aimed tokens,
the first sentence that ends is its last; the branch is stopped there and keeps its text up
to that end. The budget (the aim with headroom) still bounds a point that never ends one.
"""

from __future__ import annotations

import re

from sglang_specsot.sot.merge import SENTENCE_TERMINAL, is_abbreviation

# A sentence end confirmed by what follows it: . ! ? or an ellipsis, then closing quotes,
# brackets or emphasis, then whitespace. "3.14" and "e.g." are no end; nor is a list
# marker ("2. ") at the start of a line.
_END = re.compile(SENTENCE_TERMINAL + r"(?=\s)")
_MARKER_LINE = re.compile(r"(?:^|\n)[ \t]*(?:\d{1,3}|[a-zA-Z])[.)]$")


class AimWatch:
    """A branch's text as it streams, and where it may end once it has `aim` tokens.

    `feed` gets each new piece and the generation's token count so far; it returns the length
    of the text to keep (up to and including the sentence end) once a sentence has ended after
    the aim was reached, else None. Text written before the aim never ends the branch."""

    def __init__(self, aim: int) -> None:
        if not isinstance(aim, int) or isinstance(aim, bool) or aim < 1:
            raise ValueError(f"aim={aim!r} must be a positive number of tokens")
        self.aim = aim
        self.text = ""
        self._from: int | None = None  # where the text stood when the aim was reached

    def feed(self, piece: str, tokens: int) -> int | None:
        """Add `piece`; the text's length to keep once the branch may end, else None."""
        if self._from is None and tokens >= self.aim:
            self._from = len(self.text)  # an end in the piece that reaches the aim counts
        self.text += piece
        if self._from is None:
            return None
        for match in _END.finditer(self.text, self._from):
            if not _false_end(self.text, match):
                return match.end()
        return None


def _false_end(text: str, match: re.Match) -> bool:
    """A period that ends no sentence: an abbreviation, or a list marker opening a line."""
    head = text[: match.start() + 1]
    return is_abbreviation(head) or bool(_MARKER_LINE.search(head))
