"""How each point of a SoT answer ends: complete, mid-sentence, or on a lead-in with nothing after.

A reader's rule, from the answer text alone (no model): prose ends a sentence (". ! ?", after
any closing emphasis, quotes or brackets); a list item or a point's bare title is a phrase and
may end without one, unless it stops on a comma or a word that cannot end a phrase ("the",
"such", "including"), or its sibling items are sentences; a line ending in ":" (or a heading)
with nothing after it is a lead-in whose list is missing; a code block left open is cut.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

COMPLETE, MID_SENTENCE, LEAD_IN = "complete", "mid-sentence", "lead-in"

_POINT = re.compile(r"(\d{1,2})[.)]\s")  # a top-level point of the merged answer: "3. Title ..."
_MARKER = re.compile(r"(?:[-*+\u2022]|\d{1,3}[.)])(?:\s+|$)")  # a list item's marker
_TERMINAL = ".!?\u2026\u3002\uff01\uff1f"
# Closers that may follow a sentence's end: emphasis, code, quotes, brackets.
_CLOSERS = "*_`\"'\u201d\u2019\u00bb)]}"
# A phrase (list item, title) that stops on one of these was cut: none ends a phrase.
_OPEN_WORDS = frozenset(
    "a an the and or but nor of to in on at by for with from into onto as than that which who whose "
    "such including like is are was were be been their its your our his her this these those "
    "e.g i.e via versus vs".split()
)
_OPEN_ENDS = ",;-\u2013\u2014(/&+=%$"
# A "." that ends an abbreviation, not a sentence (the branch stopped in "such as, e.g.").
_ABBREVIATIONS = frozenset("e.g. i.e. vs. cf. mr. mrs. ms. dr. st. approx. incl. fig.".split())
TITLE_WORDS = 12  # the skeleton's longest point (SoTConfig.max_point_words): a bare title


@dataclass(frozen=True, slots=True)
class Endings:
    """The points of one answer (0-based, answer order) that end cut: mid-sentence or on an
    empty lead-in."""

    points: int
    mid_sentence: tuple[int, ...]
    lead_in: tuple[int, ...]

    @property
    def cut(self) -> int:
        return len(self.mid_sentence) + len(self.lead_in)


def split_points(answer: str) -> list[str]:
    """The answer's numbered points ("1. ...", "2. ..." at the start of a line, in order), each
    with its sub-items; an answer without them is one point."""
    parts: list[list[str]] = []
    for line in answer.split("\n"):
        match = _POINT.match(line)
        if match and int(match.group(1)) == len(parts) + 1:
            parts.append([line])
        elif parts:
            parts[-1].append(line)
    return ["\n".join(p) for p in parts] if parts else [answer]


def endings(answer: str) -> Endings:
    """Which points of `answer` end mid-sentence and which on an empty lead-in."""
    kinds = [point_ending(p) for p in split_points(answer)]
    pick = lambda kind: tuple(i for i, k in enumerate(kinds) if k == kind)  # noqa: E731
    return Endings(len(kinds), pick(MID_SENTENCE), pick(LEAD_IN))


def point_ending(text: str) -> str:
    """COMPLETE, MID_SENTENCE or LEAD_IN for one point's text (its numbered title line first)."""
    if text.count("```") % 2:
        return MID_SENTENCE  # a code block left open: the branch stopped inside it
    lines = [line.strip() for line in text.split("\n") if _has_text(line)]
    if not lines:
        return COMPLETE
    numbered = _POINT.match(lines[0])
    if numbered:
        lines[0] = lines[0][numbered.end() :].strip()
    last = lines[-1]
    if last.startswith("```") or (last.startswith("|") and last.endswith("|")):
        return COMPLETE  # a closed code block, a table row
    if last.startswith("#"):
        return LEAD_IN  # a heading with nothing under it
    item = _MARKER.match(last) if len(lines) > 1 else None  # the title line's number is gone
    body = _strip_closers(last[item.end() :] if item else last)
    if not body:
        return COMPLETE
    if body[-1] in _TERMINAL:
        return MID_SENTENCE if _last_word(body) in _ABBREVIATIONS else COMPLETE
    if body.endswith(":"):
        return LEAD_IN
    if item:
        return _phrase_ending(body, _item_run(lines[1:-1]))
    if numbered and len(lines) == 1 and _is_bare_title(body):
        return _phrase_ending(body, [])
    return MID_SENTENCE  # prose without a sentence end


def _has_text(line: str) -> bool:
    """Not blank and not a bare list marker ("-", "3.") with nothing after it."""
    stripped = line.strip()
    return bool(stripped) and not _MARKER.fullmatch(stripped + " ")


def _strip_closers(text: str) -> str:
    text = text.rstrip()
    while text and text[-1] in _CLOSERS:
        text = text[:-1].rstrip()
    return text


def _last_word(text: str) -> str:
    return text.rsplit(None, 1)[-1].lower().lstrip("(\"'*_")


def _is_bare_title(text: str) -> bool:
    """A point's title alone: short, with no sentence end inside it."""
    return len(text.split()) <= TITLE_WORDS and not re.search(r"[.!?][\s*_]", text)


def _phrase_ending(body: str, siblings: list[str]) -> str:
    """A list item or bare title ends where its phrase does; under items written as
    sentences, an item without a sentence end was cut."""
    word = _last_word(body).rstrip(".")
    if body[-1] in _OPEN_ENDS or word in _OPEN_WORDS:
        return MID_SENTENCE
    ends = [_strip_closers(line)[-1:] for line in siblings]
    if ends and all(end and end in _TERMINAL for end in ends):
        return MID_SENTENCE
    return COMPLETE


def _item_run(lines: list[str]) -> list[str]:
    """The list items directly above the last line (its siblings)."""
    run: list[str] = []
    for line in reversed(lines):
        if not _MARKER.match(line):
            break
        run.append(line)
    return run
