"""Join the skeleton's points and their branch texts into one numbered answer."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sglang_specsot.sot.loops import cut_loop
from sglang_specsot.sot.text import (
    classify_line,
    clean_model_text,
    collapse_spaces,
    point_key,
    strip_markdown,
)

logger = logging.getLogger(__name__)

_INLINE_NUMBER = re.compile(r"(?<!\S)(\d{1,2})[.)]\s+")
_HEADER_TAIL = " \t*_:.-\u2013\u2014"  # what may sit between an echoed title and the text
_CONTINUES = ",;:)"  # an expansion starting with these continues the point's own sentence


@dataclass(frozen=True, slots=True)
class MergedPoint:
    """One point of the answer with its cleaned expansion and the repairs made to it."""

    index: int
    point: str
    expansion: str  # "" when the branch gave nothing usable
    repairs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MergedAnswer:
    """The merge phase's result: the answer text and its points in skeleton order."""

    text: str
    points: tuple[MergedPoint, ...]

    @property
    def empty_points(self) -> tuple[int, ...]:
        """Indices of points whose branch produced no usable text."""
        return tuple(p.index for p in self.points if not p.expansion)


def merge_answer(points: Sequence[str], expansions: Mapping[int, str]) -> MergedAnswer:
    """Number each point with its expansion (keyed by 0-based index), in skeleton order."""
    unknown = sorted(set(expansions) - set(range(len(points))))
    if unknown:
        raise ValueError(
            f"expansions for indices {unknown} have no point (the skeleton has {len(points)}); "
            "key expansions by the branch's 0-based skeleton index"
        )
    merged = []
    for index, point in enumerate(points):
        expansion, repairs = clean_expansion(expansions.get(index, ""), index, points)
        merged.append(MergedPoint(index, point, expansion, repairs))
    text = "\n".join(_format(p) for p in merged)
    answer = MergedAnswer(text, tuple(merged))
    if answer.empty_points:
        logger.info("merged answer has empty points %s", answer.empty_points)
    return answer


_SENTENCE_END = re.compile(r"[.!?)\]](?:\*\*)?(?=\s|$)|\n")
_BARE_MARKER = re.compile(r"\n\s*(?:\d{1,2}[.)]|[-*])$")  # a list item cut right after its marker


def drop_cut_sentence(text: str) -> str:
    """`text` without its last, unfinished sentence: what a branch stopped by its token
    budget leaves ("... Use a planner to") reads worse than one sentence less. A lead-in
    left last ("Here are the steps you can follow:") goes too, since the list it introduced
    was what the budget cut; unless it is all the text there is."""
    ends = [m.end() for m in _SENTENCE_END.finditer(text.rstrip())]
    if not ends:
        return text
    kept = _BARE_MARKER.sub("", text[: ends[-1]].rstrip())  # "...:\n1." keeps no bare "1."
    if kept.endswith(":"):
        before = [end for end in ends if end < len(kept) and text[:end].strip()]
        if before:
            return text[: before[-1]].rstrip()
    return kept


def clean_expansion(text: str, index: int, points: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """Strip an echoed header, any run into other points and a repeating tail; return the
    text and the repairs made."""
    repairs: list[str] = []
    text = clean_model_text(text or "").strip()
    text, looped = cut_loop(text)
    if looped:
        repairs.append("cut a repeating loop")
    stripped = _strip_header(text, index, points[index])
    if stripped != text:
        repairs.append("stripped echoed header")
    cut = _cut_other_points(stripped, index, points)
    if cut != stripped:
        repairs.append("cut text that ran into another point")
    return _layout(cut), tuple(repairs)


def _layout(text: str) -> str:
    """Prose joined into one paragraph; a list the branch wrote (its steps or examples) kept
    as an indented bullet list, so its numbers cannot be read as the answer's own points."""
    out: list[str] = []
    prose: list[str] = []
    for line_no, line in enumerate(text.split("\n")):
        has_text = any(part.strip() for part in prose) or bool(out)
        item = classify_line(line, line_no) if has_text else None  # a list follows some prose
        if item is None or item.kind == "hash":
            prose.append(line.lstrip().lstrip("#"))  # a stray heading mark is not prose
            continue
        if prose:
            out.append(collapse_spaces(" ".join(prose)))
            prose = []
        if collapse_spaces(item.text):
            out.append(f"   - {collapse_spaces(item.text)}")
    if prose:
        out.append(collapse_spaces(" ".join(prose)))
    return "\n".join(part for part in out if part)


def _strip_header(text: str, index: int, point: str) -> str:
    """Remove a leading 'i. point' (or just 'i.', or just the point's title) the model echoed."""
    first, sep, rest = text.partition("\n")
    item = classify_line(first, 0)
    # Our own number or a heading marker at the very start is always an echo of the header.
    if item is not None and (item.kind == "hash" or item.number == index + 1):
        first = item.text
    end = _title_end(first, point)
    if end is not None:
        first = first[end:].lstrip(_HEADER_TAIL)
    return (first + sep + rest).strip()


def _title_end(line: str, point: str) -> int | None:
    """Where the point's title ends if `line` starts with it (ignoring case and markdown)."""
    want = point_key(point)
    if not want:
        return None
    if not point_key(strip_markdown(line)).startswith(want):
        return None
    # Titles are short, so trying each cut position is cheap; bounded for runaway lines.
    for end in range(1, min(len(line), 2 * len(point) + 16) + 1):
        if point_key(line[:end]) == want and (end == len(line) or not line[end].isalnum()):
            return end
    return None


def _cut_other_points(text: str, index: int, points: Sequence[str]) -> str:
    lines = text.split("\n")
    for line_no, line in enumerate(lines):
        if line_no and _starts_other_point(line, index, points):
            return "\n".join(lines[:line_no]).strip()
    return _cut_inline(text, index, points)


def _starts_other_point(line: str, index: int, points: Sequence[str]) -> bool:
    item = classify_line(line, 0)
    if item is not None and item.kind == "hash":
        return True  # a heading starts a new section of the answer, not part of this point
    # A numbered line is the branch's own list (steps, examples) unless it names another point.
    body = item.text if item is not None else line
    return any(
        _title_end(body.strip(), other) is not None
        for i, other in enumerate(points)
        if i != index
    )


def _cut_inline(text: str, index: int, points: Sequence[str]) -> str:
    """Cut at '... 3. <point 3>' written on the same line as this point's text."""
    for match in _INLINE_NUMBER.finditer(text):
        number = int(match.group(1))
        if number == index + 1 or not 1 <= number <= len(points):
            continue
        if _title_end(text[match.end() :].split("\n", 1)[0], points[number - 1]) is not None:
            return text[: match.start()].strip()
    return text


def format_point(point: MergedPoint) -> str:
    """One point's part of the answer; `MergedAnswer.text` joins these with newlines.

    Lets a streaming caller release each point as soon as its branch is done.
    """
    return _format(point)


def _format(point: MergedPoint) -> str:
    head = f"{point.index + 1}. {point.point}"
    body = point.expansion
    if not body:
        return head
    if body[0] in _CONTINUES:
        return head + body
    if body[0].islower():
        return f"{head} {body}"
    end = "" if point.point[-1:] in ".!?:" else "."
    return f"{head}{end} {body}"
