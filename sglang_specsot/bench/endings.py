"""How each point of a SoT answer ends: complete, mid-sentence, or on a lead-in with nothing after.

A reader's rule, from the answer text alone (no model): prose ends a sentence (". ! ?", after
any closing emphasis, quotes or brackets); a list item or a point's bare title is a phrase and
may end without one, unless it stops on a comma or a word that cannot end a phrase ("the",
"such", "including"), or its sibling items are sentences; a line ending in ":" (or a heading)
with nothing after it is a lead-in whose list is missing, and so is one with a single item after
it ("Here are some tips:" and one tip: the list was cut after its first item); a code block
left open is cut. Given the skeleton's titles, a point is a bare title only where its text is
its title: one that goes on past it is prose, and must end a sentence.
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
# A lead-in that announces one item ("Here is an example:") may be followed by one item.
_ONE_ITEM_LEADS = re.compile(r"\b(?:an? (?:\w+ )?(?:example|instance|tip|way|step)|example|for instance|e\.g\.)\b", re.I)


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


def endings(answer: str, titles: list[str] | None = None) -> Endings:
    """Which points of `answer` end mid-sentence and which on an empty lead-in; `titles` (the
    skeleton's points, in order), where known, tell a bare title from a point cut early."""
    points = split_points(answer)
    kinds = [point_ending(p, titles[i] if titles and i < len(titles) else None) for i, p in enumerate(points)]
    pick = lambda kind: tuple(i for i, k in enumerate(kinds) if k == kind)  # noqa: E731
    return Endings(len(kinds), pick(MID_SENTENCE), pick(LEAD_IN))


def point_ending(text: str, title: str | None = None) -> str:
    """COMPLETE, MID_SENTENCE or LEAD_IN for one point's text (its numbered title line first);
    `title`, where known, is the skeleton's title of the point."""
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
    kind = _last_line_ending(last, item, lines, numbered, title)
    if kind == COMPLETE and item and _one_item_list(lines[:-1]):
        return LEAD_IN  # the list its lead-in announced stops after its first item
    return kind


def _last_line_ending(last: str, item, lines: list[str], numbered, title: str | None) -> str:
    body = _strip_closers(last[item.end() :] if item else last)
    if not body:
        return COMPLETE
    if body[-1] in _TERMINAL:
        return MID_SENTENCE if _last_word(body) in _ABBREVIATIONS else COMPLETE
    if body.endswith(":"):
        return LEAD_IN
    if item:
        return _phrase_ending(body, _item_run(lines[1:-1]))
    if numbered and len(lines) == 1 and _is_bare_title(body, title):
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


def _is_bare_title(text: str, title: str | None = None) -> bool:
    """A point's title alone: its title where known ("5. Displacement of workers is a
    significant" is a point cut early), else short with no sentence end inside it."""
    if title is not None:
        return _words(text) == _words(title)
    return len(text.split()) <= TITLE_WORDS and not re.search(r"[.!?][\s*_]", text)


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.replace("**", "").lower())


def _one_item_list(above: list[str]) -> bool:
    """Whether the last line is the only item under a lead-in: the line above it ends in ":"
    and is no item itself, and does not announce a single item."""
    if not above:
        return False
    lead = _strip_closers(above[-1])
    return lead.endswith(":") and not _MARKER.match(above[-1]) and not _ONE_ITEM_LEADS.search(lead)


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
