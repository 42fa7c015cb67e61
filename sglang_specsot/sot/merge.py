"""Join the skeleton's points and their branch texts into one numbered answer."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sglang_specsot.sot.grammar import FINITE, LEANS_BACK, is_instruction, says_nothing_new
from sglang_specsot.sot.loops import cut_loop
from sglang_specsot.sot.prompts import title_lead_in
from sglang_specsot.sot.stems import WORD
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


def merge_answer(points: Sequence[str], expansions: Mapping[int, str], question: str = "") -> MergedAnswer:
    """Number each point with its expansion (keyed by 0-based index), in skeleton order;
    `question` lets an opening sentence that only restates it go (`drop_restating_opener`)."""
    unknown = sorted(set(expansions) - set(range(len(points))))
    if unknown:
        raise ValueError(
            f"expansions for indices {unknown} have no point (the skeleton has {len(points)}); "
            "key expansions by the branch's 0-based skeleton index"
        )
    merged = []
    for index, point in enumerate(points):
        expansion, repairs = clean_expansion(expansions.get(index, ""), index, points, question)
        merged.append(MergedPoint(index, point, expansion, repairs))
    text = "\n".join(_format(p) for p in merged)
    answer = MergedAnswer(text, tuple(merged))
    if answer.empty_points:
        logger.info("merged answer has empty points %s", answer.empty_points)
    return answer


# A sentence ends at . ! ? (closing quotes, brackets or emphasis may follow) before a space,
# and a line at its break (a list item or heading needs no period). A closing bracket alone
# ends nothing: "For example, the National Institutes of Health (NIH)" is cut.
SENTENCE_TERMINAL = r"[.!?\u2026][\"'\u201d\u2019)\]*_]*"  # an end mark and its closers
_SENTENCE_END = re.compile(SENTENCE_TERMINAL + r"(?=\s|$)|\n")
_ABBREVIATION = re.compile(r"(?:\b(?:e\.g|i\.e|vs|cf|approx|incl)\.)$", re.IGNORECASE)
_BARE_MARKER = re.compile(r"\n\s*(?:\d{1,2}[.)]|[-*])$")  # a list item cut right after its marker
_CLAUSE_END = re.compile(r"[,;](?=\s)")
# With no sentence ended, a budget-cut text ends at its last clause that has this many words:
# "... steps through the list to be sorted, compares ... if they are in the wrong" keeps
# "... the list to be sorted." rather than the point losing all its text.
MIN_CLAUSE_WORDS = 8
_FENCE = "```"
_HEADING = re.compile(r"#{1,6}\s")
_CLOSERS = "*_`\"'\u201d\u2019 "  # may follow a lead-in's colon: "**Examples:**"


def drop_cut_sentence(text: str) -> str:
    """`text` cut by its token budget, without its unfinished sentence: it ends at its last
    complete sentence ("... Use a planner to" reads worse than one sentence less), an open
    code block goes, and so does a lead-in left last (`drop_lead_in`). With no sentence
    ended, it ends at its last long clause, closed with a period, or is dropped."""
    text = text.strip()
    if text.count(_FENCE) % 2:  # cut inside a code block: the block goes
        text = text[: text.rfind(_FENCE)].rstrip()
    ends = [m.end() for m in _SENTENCE_END.finditer(text) if not is_abbreviation(text[: m.start() + 1])]
    if not ends:
        return _last_clause(text)
    return drop_lead_in(_BARE_MARKER.sub("", text[: ends[-1]].rstrip()))  # "...:\n1." keeps no bare "1."


def is_abbreviation(text: str) -> bool:
    """Whether `text` ends in an abbreviation's period ("e.g."), which ends no sentence."""
    return bool(_ABBREVIATION.search(text[-8:]))


def _last_clause(text: str) -> str:
    """The text up to its last clause break after MIN_CLAUSE_WORDS words, as one sentence; ""
    when there is none."""
    for match in reversed(list(_CLAUSE_END.finditer(text))):
        clause = text[: match.start()].rstrip()
        if len(clause.split()) >= MIN_CLAUSE_WORDS:
            return clause + "."
    return ""


def drop_lead_in(text: str) -> str:
    """`text` without a lead-in left last ("Here are the steps:", "- **Use cases**:", a
    heading): the list it introduced is gone, cut by the budget or as a run into other
    points. "" when the lead-in was all there was."""
    text = text.rstrip()
    while text:
        head, newline, line = text.rpartition("\n")
        stripped = line.strip()
        if _HEADING.match(stripped) or _BARE_MARKER.search("\n" + stripped):
            text = head.rstrip()  # a heading or a bare list marker with nothing under it
        elif stripped.rstrip(_CLOSERS).endswith(":"):  # the lead-in's own sentence goes
            ends = [m.end() for m in _SENTENCE_END.finditer(stripped.rstrip(_CLOSERS)[:-1])]
            kept = line[: line.index(stripped) + ends[-1]] if ends else ""
            text = (head + newline + kept).rstrip()
        else:
            break
    return text


def clean_expansion(text: str, index: int, points: Sequence[str], question: str = "") -> tuple[str, tuple[str, ...]]:
    """Strip an echoed header, any run into other points, a repeating tail and an opening
    sentence that only restates the title or `question`; return the text and the repairs made."""
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
    # A list that ran into other points leaves its lead-in last ("Here are some tips:" and
    # then "1. <another point's title>"); a point never ends announcing what is not there.
    led = drop_lead_in(cut)
    if led != cut.rstrip():
        repairs.append("dropped a lead-in left last")
        cut = led
    folded = fold_one_item_list(cut)
    if folded != cut:
        repairs.append("folded a one-item list into its point")
        cut = folded
    opened = drop_restating_opener(cut, points[index], question)
    if opened != cut:
        repairs.append("dropped an opening sentence that restated the title or question")
        cut = opened
    return _layout(cut), tuple(repairs)


def drop_restating_opener(text: str, title: str, question: str = "") -> str:
    """`text` without its first sentence where that sentence says nothing its title or the
    question does not (sot.grammar.says_nothing_new: "Prioritizing tasks is crucial for managing
    time effectively.") and at least one sentence of the same paragraph follows it, one that does
    not lean back on it ("This is because ..."); else `text`. A point is never emptied, and a
    sentence that gives a reason is kept."""
    end = _SENTENCE_END.search(text)
    if end is None or text[end.start()] == "\n":
        return text
    first, rest = text[: end.end()], text[end.end() :].lstrip(" ")
    if not rest or rest[0] == "\n" or _SENTENCE_END.search(rest) is None or LEANS_BACK.match(rest):
        return text
    if not says_nothing_new(first, title, question):
        return text
    return rest[0].upper() + rest[1:]


def fold_one_item_list(text: str) -> str:
    """`text` whose lead-in announces a list of which only one item came ("Here are some key
    points to consider:" then "- **Warm-up**: ...", the branch ended at its aim): the lead-in
    sentence goes and the item stays as the point's last sentence, so no point announces a list
    it does not give. Text with no such ending is returned as it is."""
    lines = text.rstrip().split("\n")
    items = [i for i, line in enumerate(lines) if (item := classify_line(line, i)) and item.kind in ("number", "bullet")]
    if len(items) != 1 or items[0] != len(lines) - 1:
        return text
    before = "\n".join(lines[: items[0]]).rstrip()
    if not before.rstrip(_CLOSERS).endswith(":"):
        return text
    item = strip_markdown(classify_line(lines[-1], len(lines) - 1).text).strip()
    return f"{drop_lead_in(before)} {item}".strip()


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
    """"i. **Title**: body", as the branch wrote it after its pre-filled title lead-in
    (prompts.title_lead_in): the title stands apart, so no reading joins it into the body's
    first sentence; a point with no body keeps its bold title alone. A body that goes on with
    the title as its subject ("**Nationalism**: is a feeling ...") loses the colon, so the
    sentence reads whole ("**Nationalism** is a feeling ..."); an instruction for a title
    ("Take breaks") stays apart, as no join makes that grammatical."""
    head = f"{point.index + 1}. {title_lead_in(point.point)}"
    if not point.expansion:
        return head.rstrip(":")
    if continues_title(point.point, point.expansion):
        return f"{head.removesuffix(':')} {point.expansion}"
    return f"{head} {point.expansion}"


def continues_title(title: str, body: str) -> bool:
    """Whether `body` opens on a lower-case finite verb whose subject is a title that is no
    instruction (sot.grammar)."""
    first_of_body, title_words = WORD.match(body.lstrip()), WORD.findall(title)
    return first_of_body is not None and first_of_body.group() in FINITE and bool(title_words) and not is_instruction(title_words)
