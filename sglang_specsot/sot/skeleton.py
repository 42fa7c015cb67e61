"""Parse a model's skeleton into points: a plan, a direct answer, or an error; never raises."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from sglang_specsot.sot.config import DEFAULT_CONFIG, SoTConfig
from sglang_specsot.sot.prompts import SKELETON_PREFILL
from sglang_specsot.sot.stems import content_stems, same_idea
from sglang_specsot.sot.text import (
    ListLine,
    classify_line,
    clean_model_text,
    collapse_spaces,
    has_words,
    is_hash_terminator,
    point_key,
    split_predicted_length,
    strip_markdown,
)

logger = logging.getLogger(__name__)

PLAN, DIRECT, ERROR = "plan", "direct", "error"
# A skeleton is a few hundred characters; scanning more only costs time on runaway output.
_MAX_SCAN_CHARS = 20_000
# Lead-ins a model writes before its list ("Sure! Here is the skeleton:"); dropped only when
# the item also ends with a colon, so a real point such as "Answer honestly" survives.
_PREAMBLE = re.compile(
    r"^(sure|okay|ok|certainly|of course|absolutely|here|below|the following|"
    r"skeleton|outline|answer|points?)\b",
    re.IGNORECASE,
)
_INLINE_MARKER = re.compile(r"(?<!\S)(\d{1,2})[.)](?=\s)")
_TITLE_SEPARATORS = (": ", " - ", " \u2013 ", " \u2014 ", "; ")
_SENTENCE_END = re.compile(r"[.!?](?=\s)")
# Lines no plan of 3-5 word points contains: a code fence, or a statement of a common language.
_CODE_LINE = re.compile(
    r"```|^\s*(#include\b|def \w+\(|class \w+[:(]|import \w|from [\w.]+ import |"
    r"(public|private|static) \w|int main\(|(for|while|if) ?\(.*\) ?\{|return [^.]*;)"
    r"|\{\s*$|\)\s*;\s*$|std::|console\.log\(|System\.out"
)
# One repeated point is a slip the merge loses nothing by dropping; more is a decoding loop
# ("Increased global trade" five times) whose plan cannot be trusted to cover the question.
MAX_REPEATED_POINTS = 1
_SYMBOLS_OK = set("*#_-.,:;()[]|`>~=+\"'!?/%&")


@dataclass(frozen=True, slots=True)
class SkeletonPoint:
    """One point of the skeleton and, in the `####Title(n):` form, its predicted length."""

    text: str
    predicted_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class SkeletonParse:
    """The parse phase's result; `points` is non-empty exactly when `outcome == "plan"`."""

    outcome: str  # "plan" | "direct" (answer normally) | "error" (degenerate output)
    points: tuple[SkeletonPoint, ...]
    reason: str
    list_format: str  # "numbered" | "bulleted" | "hash" | "inline" | "none"
    notes: tuple[str, ...] = ()  # repairs made on the way: duplicates, caps, truncations
    long_points: tuple[int, ...] = ()  # indices kept over the length limit (policy "flag")

    @property
    def is_plan(self) -> bool:
        return self.outcome == PLAN

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(p.text for p in self.points)


def parse_skeleton(
    text: str,
    config: SoTConfig = DEFAULT_CONFIG,
    *,
    prefill: str = SKELETON_PREFILL,
    truncated: bool = False,
) -> SkeletonParse:
    """Parse skeleton text; `prefill` is what the assistant turn was pre-filled with, and
    `truncated` says the skeleton was cut by its token cap.

    Only a whole plan is a plan: a skeleton that was cut off, repeats a point or holds code
    would yield an answer that silently covers part of the question, so it is an error and
    the caller answers normally.
    """
    if not isinstance(text, str):
        return SkeletonParse(ERROR, (), f"skeleton is {type(text).__name__}, not text", "none")
    body = clean_model_text(text[:_MAX_SCAN_CHARS])
    problem = _degenerate(body) or _unfinished(body, truncated)
    if problem:
        return _finish(SkeletonParse(ERROR, (), problem, "none"))
    list_format, items = _extract_items(_with_prefill(body, prefill), config)
    points, notes, long_points, duplicates = _clean_points(items, config)
    if duplicates > MAX_REPEATED_POINTS and len(points) >= config.min_points:
        reason = f"the skeleton repeats {duplicates} points: a decoding loop, not a plan"
        return _finish(SkeletonParse(ERROR, (), reason, list_format, notes))
    if len(text) > _MAX_SCAN_CHARS:
        notes += (f"read only the first {_MAX_SCAN_CHARS} of {len(text)} characters",)
    points, long_points, merged = merge_same_ideas(points, long_points, config.min_points)
    notes += merged
    if len(points) < config.min_points:
        return _finish(_too_few(body, duplicates, points, list_format, notes, config))
    if len(points) > config.max_points:
        notes += (f"kept the first {config.max_points} of {len(points)} points",)
        points = points[: config.max_points]
        long_points = tuple(i for i in long_points if i < config.max_points)
    reason = f"{len(points)} points"
    return _finish(SkeletonParse(PLAN, tuple(points), reason, list_format, notes, long_points))


def _finish(parse: SkeletonParse) -> SkeletonParse:
    logger.debug("skeleton parse: %s (%s) %s", parse.outcome, parse.reason, parse.notes)
    return parse


def _degenerate(body: str) -> str | None:
    """Why the output cannot be language at all, or None when it may be."""
    if not body.strip():
        return "empty skeleton"
    if not any(ch.isalpha() for ch in body):
        return "no words in the skeleton"
    counted = [ch for ch in body if not ch.isspace() and ch not in _SYMBOLS_OK]
    letters = sum(ch.isalpha() for ch in counted)
    if letters < 0.3 * len(counted):
        return f"skeleton is mostly symbols ({letters} letters in {len(counted)} characters)"
    return None


def _unfinished(body: str, truncated: bool) -> str | None:
    """Why the skeleton is not a whole plan of words, or None."""
    if truncated:
        return "the skeleton was cut by its token cap, so its plan is incomplete"
    code = next((line for line in body.split("\n") if _CODE_LINE.search(line)), None)
    if code is not None:
        return f"the skeleton holds code ({code.strip()[:40]!r}), not a plan of points"
    return None


def _with_prefill(body: str, prefill: str) -> str:
    """Put the pre-filled marker back, unless the model wrote its own first marker."""
    if not prefill:
        return body
    first = next((line for line in body.split("\n") if line.strip()), "")
    if classify_line(first, 0) is not None:
        return body
    return prefill + ("" if body[:1].isspace() else " ") + body


def _too_few(
    body: str,
    duplicates: int,
    points: list[SkeletonPoint],
    list_format: str,
    notes: tuple[str, ...],
    config: SoTConfig,
) -> SkeletonParse:
    # Several list items that collapse to one point is a decoding loop, not a direct answer.
    if _looks_repetitive(body) or (duplicates >= 2 and len(points) == 1):
        return SkeletonParse(ERROR, (), "output repeats itself", list_format, notes)
    reason = (
        f"{len(points)} distinct point(s), a plan needs at least {config.min_points}; "
        "answer normally"
    )
    return SkeletonParse(DIRECT, (), reason, list_format, notes)


def _looks_repetitive(body: str) -> bool:
    words = point_key(body).split()
    if len(words) >= 8 and len(set(words)) < 0.3 * len(words):
        return True
    lines = [point_key(line) for line in body.split("\n") if has_words(line)]
    return len(lines) >= 4 and len(set(lines)) == 1


def _extract_items(body: str, config: SoTConfig) -> tuple[str, list[str]]:
    """Find the skeleton's list in the text; return its format and the items' raw text."""
    lines = _list_lines(body)
    numbered = [x for x in lines if x.kind == "number"]
    bullets = [x for x in lines if x.kind == "bullet"]
    hashes = [x for x in lines if x.kind == "hash"]
    if len(hashes) >= 2 and any(split_predicted_length(x.text)[1] is not None for x in hashes):
        return "hash", [x.text for x in hashes]
    if len(numbered) >= 2:
        return "numbered", [x.text for x in _first_list(_top_level(numbered), config)]
    if len(numbered) + len(bullets) >= 2:
        mixed = sorted(numbered + bullets, key=lambda x: x.line_no)
        return "bulleted", [x.text for x in _top_level(mixed)]
    if len(hashes) >= 2:
        return "hash", [x.text for x in hashes]
    inline = _split_inline(body)
    if len(inline) >= 2:
        return "inline", inline
    single = numbered + bullets
    return "none", [single[0].text if single else body]


def _list_lines(body: str) -> list[ListLine]:
    found = []
    for line_no, line in enumerate(body.split("\n")):
        if is_hash_terminator(line):
            break
        item = classify_line(line, line_no)
        if item is not None:
            found.append(item)
    return found


def _top_level(items: list[ListLine]) -> list[ListLine]:
    """Keep the outermost items: the smallest indent that at least two items share."""
    for level in sorted({x.indent for x in items}):
        # One column of slack: models indent top-level items inconsistently by a space.
        outer = [x for x in items if x.indent <= level + 1]
        if len(outer) >= 2:
            return outer
    return items


def _first_list(items: list[ListLine], config: SoTConfig) -> list[ListLine]:
    """Stop where numbering restarts at 1: the model is repeating itself or answering."""
    kept: list[ListLine] = []
    for item in items:
        restarted = item.number == 1 and kept and (kept[-1].number or 0) > 1
        if restarted and len(kept) >= config.min_points:
            break
        kept.append(item)
    return kept


def _split_inline(body: str) -> list[str]:
    """Split '1. A 2. B 3. C' written on one line, following numbers 1, 2, 3... in order."""
    text = collapse_spaces(body[:4000])
    cuts: list[tuple[int, int]] = []
    expected = 1
    for match in _INLINE_MARKER.finditer(text):
        if int(match.group(1)) == expected:
            cuts.append((match.start(), match.end()))
            expected += 1
    if len(cuts) < 2:
        return []
    ends = [start for start, _ in cuts[1:]] + [len(text)]
    return [text[end:stop].strip() for (_, end), stop in zip(cuts, ends)]


def _clean_points(
    items: list[str], config: SoTConfig
) -> tuple[list[SkeletonPoint], tuple[str, ...], tuple[int, ...], int]:
    """Distinct, non-empty points within the length policy; also notes, long indices, duplicates."""
    points: list[SkeletonPoint] = []
    seen: set[str] = set()
    notes: list[str] = []
    long_points: list[int] = []
    duplicates = 0
    for raw in items:
        point, is_long = _to_point(raw, config)
        if point is None:
            notes.append(f"dropped an empty or preamble item {collapse_spaces(raw)[:40]!r}")
            continue
        key = point_key(point.text)
        if key in seen:
            duplicates += 1
            notes.append(f"dropped duplicate point {point.text[:40]!r}")
            continue
        seen.add(key)
        if is_long:
            long_points.append(len(points))
        points.append(point)
    if long_points and config.long_point_policy == "flag":
        notes.append(f"{len(long_points)} point(s) longer than the limit kept as written")
    flagged = tuple(long_points) if config.long_point_policy == "flag" else ()
    return points, tuple(notes), flagged, duplicates


def merge_same_ideas(
    points: list[SkeletonPoint], long_points: tuple[int, ...], floor: int
) -> tuple[list[SkeletonPoint], tuple[int, ...], tuple[str, ...]]:
    """(points, long indices, notes) with each point that repeats an earlier one in other words
    ("Entertainment options" after "Entertainment") dropped, while more than `floor` points
    remain: two branches written on one idea say the same thing twice, which a reader sees as
    repetition. The floor keeps a plan a plan: a skeleton of few points keeps its twins."""
    ideas = [_idea(p.text) for p in points]
    kept: list[int] = []
    notes: list[str] = []
    for i, point in enumerate(points):
        twin = next((points[k].text for k in kept if same_idea(ideas[i], ideas[k])), None)
        if twin is not None and len(points) - (i - len(kept)) > floor:
            notes.append(f"dropped point {point.text[:40]!r}: the same idea as {twin[:40]!r}")
            continue
        kept.append(i)
    index = {old: new for new, old in enumerate(kept)}
    return [points[k] for k in kept], tuple(index[i] for i in long_points if i in index), tuple(notes)


def _idea(title: str) -> set[str]:
    # Numbers count: "Step 1" and "Step 2" are two points.
    return content_stems(title) | set(re.findall(r"\d+", title))


def _to_point(raw: str, config: SoTConfig) -> tuple[SkeletonPoint | None, bool]:
    """Clean one item; None for empty or preamble items. The flag says it was too long."""
    title, predicted, _ = split_predicted_length(raw)
    text = collapse_spaces(strip_markdown(_bold_title(title)))
    # Trailing ":" or "..." and a stray leading "." (the model re-typing the prefill's dot).
    text = text.rstrip(" :;,.\u2026-\u2013\u2014").lstrip(" .:;,)").strip()
    if not has_words(text) or _is_preamble(text, title):
        return None, False
    if not _too_long(text, config):
        return SkeletonPoint(text, predicted), False
    if config.long_point_policy == "truncate":
        text = _shorten(text, config)
        if not has_words(text):  # the words lay beyond the cut: nothing usable is left
            return None, False
    return SkeletonPoint(text, predicted), True


def _bold_title(text: str) -> str:
    """'**Set goals**: write them down' -> 'Set goals': bold marks the point's own title."""
    for mark in ("**", "__"):
        if text.startswith(mark):
            end = text.find(mark, len(mark))
            if end > len(mark) and text[end + len(mark) :].strip():
                return text[len(mark) : end]
    return text


def _is_preamble(text: str, raw: str) -> bool:
    lowered = text.casefold()
    if lowered.startswith(("question:", "skeleton:")) or lowered in ("skeleton", "outline"):
        return True
    return raw.rstrip().endswith(":") and bool(_PREAMBLE.match(text))


def _too_long(text: str, config: SoTConfig) -> bool:
    return len(text.split()) > config.max_point_words or len(text) > config.max_point_chars


def _shorten(text: str, config: SoTConfig) -> str:
    """Cut a long point to its title (before a colon or dash), first sentence, or word limit."""
    for candidate in (_before_separator(text), _first_sentence(text)):
        if candidate and has_words(candidate) and not _too_long(candidate, config):
            return candidate
    words = text.split()[: config.max_point_words]
    cut = " ".join(words)
    if len(cut) > config.max_point_chars:
        space = cut.rfind(" ", 0, config.max_point_chars + 1)
        cut = cut[: space if space > 0 else config.max_point_chars]
    return cut.rstrip(" :;,.-") or cut


def _before_separator(text: str) -> str:
    cuts = [text.find(sep) for sep in _TITLE_SEPARATORS if sep in text]
    return text[: min(cuts)].strip() if cuts else ""


def _first_sentence(text: str) -> str:
    match = _SENTENCE_END.search(text)
    return text[: match.start()].strip() if match else ""
