"""What a reader sees in a SoT answer, from its text, its skeleton and the question (no model).

Per answer: visible words; per point, sentences beyond the title, whether the body opens by
restating the title or the question, and whether an imperative title is continued as a subject
("Take breaks are crucial"); lists cut after a one-item lead-in; skeleton points another point
repeats; and the normal answer's item count, to set beside the SoT answer's point count.
Words are compared as crude stems (lower case, common suffixes cut), which is enough to see a
title's words again in the sentence after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sglang_specsot.bench.endings import split_points
from sglang_specsot.bench.metrics import sentences
from sglang_specsot.sot.grammar import FINITE as _FINITE
from sglang_specsot.sot.grammar import FILLER, QUESTION_WORDS, is_instruction, restates
from sglang_specsot.sot.stems import TITLE_OVERLAP, content_stems
from sglang_specsot.sot.stems import WORD as _WORD

# An imperative title continued as a subject: a finite verb follows it within a few words.
GLUE_WINDOW = 5  # words after the title in which the finite verb must come
REPEAT_STEMS = 3  # a title repeated in another point's body has at least this many content stems


def visible_words(text: str) -> int:
    """Words a reader sees (markdown marks are no words)."""
    return len(_WORD.findall(text))


@dataclass(frozen=True, slots=True)
class PointReading:
    """One point of a SoT answer as a reader meets it."""

    title: str
    sentences: int  # sentences of content beyond the title
    restates: bool  # its body opens by restating its title or the question
    glued: bool  # an imperative title continued as a subject ("Take breaks are crucial")


def split_title(point: str, title: str) -> tuple[str, bool]:
    """(the point's text after its title, whether the title stands alone: followed by ". " or
    ": " rather than continued in its sentence). A point not starting with its title is all body."""
    text = re.sub(r"^\s*\d{1,2}[.)]\s*", "", point).replace("**", "")
    pattern = r"\W+".join(re.escape(w) for w in _WORD.findall(title))
    match = re.match(pattern, text, re.IGNORECASE) if pattern else None
    if match is None:
        return text.strip(), True
    rest = text[match.end() :]
    alone = bool(re.match(r"\s*[.:!?\-\u2013\u2014]", rest)) or not rest.strip()
    return rest.lstrip(" .:!?-\u2013\u2014").strip() if alone else text.strip(), alone


def read_point(point: str, title: str, question: str) -> PointReading:
    """A PointReading of one merged point (its numbered line first) under its skeleton title."""
    body, alone = split_title(point, title)
    found = sentences(body)
    opening = found[0] if found else ""
    return PointReading(title, len(found), bool(opening) and restates(opening, title, question),
                        glued(body, title) if not alone else opens_on_verb(body))  # fmt: skip


def glued(continued: str, title: str) -> bool:
    """Whether an imperative `title` is continued as the subject of a verb in `continued` (the
    point's text, its title first): "Prioritize needs is a crucial step"."""
    title_words = _WORD.findall(title)
    if not is_instruction(title_words):
        return False
    after = re.split(r"[.,;:!?]", continued, maxsplit=1)[0]
    tail = [w.lower() for w in _WORD.findall(after)][len(title_words) :][:GLUE_WINDOW]
    return any(w in _FINITE for w in tail)


def opens_on_verb(body: str) -> bool:
    """Whether a body after its title and colon opens on a finite verb in lower case: the title
    is the verb's subject across the colon ("**Energy efficiency**: is the practice of ..."), a
    glued title a reader sees as one broken sentence."""
    words = _WORD.findall(body)
    return bool(words) and words[0] in _FINITE


def one_item_lead_ins(answer: str) -> int:
    """Lead-ins ("Here are some tips:") with exactly one list item under them: items of the
    first item's kind and indentation, deeper lines between them skipped."""
    lines = [line.rstrip() for line in answer.split("\n") if line.strip()]
    count = 0
    for i, line in enumerate(lines[:-1]):
        # The lead-in may end a point's own numbered line ("3. Save. This includes:").
        if line.rstrip("*_ ").endswith(":") and _item_kind(lines[i + 1]):
            count += _items_from(lines[i + 1 :]) == 1
    return count


def _item_kind(line: str) -> str | None:
    """"bullet" or "number" for a list item's line, None for any other."""
    stripped = line.lstrip()
    if re.match(r"[-*+\u2022]\s", stripped) and not stripped.startswith("**"):
        return "bullet"
    return "number" if re.match(r"\d{1,3}[.)]\s", stripped) else None


def _items_from(lines: list[str]) -> int:
    """How many items of the first line's kind and indentation follow one another."""
    kind, indent = _item_kind(lines[0]), _indent(lines[0])
    count = 0
    for line in lines:
        if _indent(line) > indent:
            continue  # an item's own sub-lines
        if _indent(line) < indent or _item_kind(line) != kind:
            break
        count += 1
    return count


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def repeated_points(titles: list[str], bodies: list[str], question: str) -> list[tuple[int, int]]:
    """(i, j) where point j repeats point i: j's title shares most of i's stems, or j's body
    holds every stem of i's title (the question's own words and fillers aside; only titles of at
    least REPEAT_STEMS such stems, since a short title is named in passing by other points)."""
    drop = FILLER | QUESTION_WORDS
    question_stems = content_stems(question, drop)
    stems = [content_stems(t, drop) - question_stems for t in titles]
    out = []
    for i, mine in enumerate(stems):
        for j in range(len(titles)):
            if j == i:
                continue
            similar_title = len(mine & stems[j]) >= TITLE_OVERLAP * max(len(mine | stems[j]), 1) and j > i
            in_body = len(mine) >= REPEAT_STEMS and j < len(bodies) and mine <= content_stems(bodies[j], drop)
            if similar_title or in_body:
                out.append((i, j))
    return out


def list_items(answer: str) -> int:
    """The top-level items of an answer: its numbered points, else its unindented bullets."""
    points = split_points(answer)
    if len(points) > 1 or re.match(r"\s*1[.)]\s", answer.lstrip()):
        return len(points)
    return sum(bool(re.match(r"[-*+\u2022]\s", line)) for line in answer.split("\n"))


def without_shared_opening(answer: str, normal: str) -> tuple[str, str]:
    """Both answers without the opening paragraph they share word for word (a SoT answer copies
    the normal answer's opening line), which no branch wrote; as they came otherwise."""
    head, rest = _opening(answer)
    other_head, other_rest = _opening(normal)
    if head and " ".join(head.split()) == " ".join(other_head.split()):
        return rest, other_rest
    return answer, normal


def _opening(text: str) -> tuple[str, str]:
    """(the text before its first numbered point or blank line, the rest)."""
    match = re.search(r"\n\s*\n|\n(?=\s*1[.)]\s)", text)
    if match is None:
        return "", text
    return text[: match.start()].strip(), text[match.end() :].strip()


@dataclass(frozen=True, slots=True)
class AnswerReading:
    """One SoT answer as a reader sees it, beside the normal answer to the same question."""

    visible_words: int
    normal_visible_words: int
    points: tuple[PointReading, ...]
    normal_items: int  # top-level items of the normal answer
    one_item_lead_ins: int
    repeated: tuple[tuple[int, int], ...]  # (i, j): point j repeats point i's title

    @property
    def words_ratio(self) -> float | None:
        return self.visible_words / self.normal_visible_words if self.normal_visible_words else None


def read_answer(answer: str, titles: list[str], normal: str, question: str) -> AnswerReading:
    """An AnswerReading of a merged SoT answer under its skeleton's `titles`."""
    points = split_points(answer)
    if len(points) == 1 and not re.match(r"\s*1[.)]\s", points[0]):
        points = []
    else:  # points past the skeleton's are none of its (the merge adds none)
        points = points[: len(titles)] if titles else points
    readings = tuple(read_point(p, titles[i] if i < len(titles) else "", question) for i, p in enumerate(points))
    bodies = [split_title(p, titles[i] if i < len(titles) else "")[0] for i, p in enumerate(points)]
    return AnswerReading(visible_words(answer), visible_words(normal), readings, list_items(normal),
                         one_item_lead_ins(answer), tuple(repeated_points(titles, bodies, question)))  # fmt: skip
