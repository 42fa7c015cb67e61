"""Small text helpers shared by skeleton parsing and merging: list markers, markdown, keys."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# Every pattern here is matched against one line that has already been stripped, and none
# has two adjacent unbounded repeats, so matching stays linear on hostile input.
_NUMBER_MARKER = re.compile(
    r"(?:(?:step|point|part|tip|idea|reason|item)\s{0,3})?"
    r"\(?(\d{1,3})(?:[.):]|\s{0,3}[-\u2013\u2014])(?!\d)",
    re.IGNORECASE,
)
_ASCII_BULLETS = "-*+"  # need a space after them: "*bold*" and "-5" are not bullets
_UNICODE_BULLETS = "\u2022\u25aa\u2023\u25e6\u00b7"
_HASH_LENGTH = re.compile(r"\(\s{0,3}(\d{1,6})\s{0,3}(?:tokens?|words?)?\s{0,3}\)", re.IGNORECASE)
_SPECIAL_TOKEN = re.compile(r"<\|[^|<>\n]{1,40}\|>|</?s>")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd\ufeff]")


@dataclass(frozen=True, slots=True)
class ListLine:
    """One line of model output seen as a list item: its kind, number, indent and text."""

    kind: str  # "number" | "bullet" | "hash"
    number: int | None  # the written number of a numbered item
    indent: int  # leading spaces (tabs count 4): tells top-level items from nested ones
    text: str  # everything after the marker, not yet cleaned
    line_no: int


def clean_model_text(text: str) -> str:
    """Drop control characters and chat special tokens, and normalise newlines."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _SPECIAL_TOKEN.sub("", text)
    return _CONTROL.sub("", text)


def _strip_decorations(line: str) -> tuple[str, bool, str]:
    """Strip leading heading hashes and an opening bold marker; report what was stripped."""
    had_hash = line.startswith("#")
    line = line.lstrip("#").lstrip()
    for mark in ("**", "__"):
        if line.startswith(mark):
            return line[len(mark) :].lstrip(), had_hash, mark
    return line, had_hash, ""


def classify_line(raw: str, line_no: int) -> ListLine | None:
    """Return the line as a numbered, bulleted or heading item, or None for plain prose."""
    stripped = raw.lstrip()
    if not stripped:
        return None
    indent = len(raw.expandtabs(4)) - len(stripped.expandtabs(4))
    body, had_hash, bold = _strip_decorations(stripped.rstrip())
    match = _NUMBER_MARKER.match(body)
    if match:
        rest = body[match.end() :].strip()
        if bold and rest.startswith(bold):  # "**1.** Text": the bold closed right after the number
            rest = rest[len(bold) :].strip()
        return ListLine("number", int(match.group(1)), indent, rest, line_no)
    if not had_hash and _is_bullet(stripped):
        return ListLine("bullet", None, indent, stripped[1:].strip(), line_no)
    if had_hash and body and not set(body) <= set("%#"):
        return ListLine("hash", None, indent, body, line_no)
    return None


def _is_bullet(stripped: str) -> bool:
    if stripped[0] in _UNICODE_BULLETS:
        return True
    return len(stripped) > 1 and stripped[0] in _ASCII_BULLETS and stripped[1] in " \t"


def is_hash_terminator(line: str) -> bool:
    """The research skeleton format ends its list with a line like '####%%%%'."""
    body = line.strip()
    return body.startswith("#") and "%" in body and set(body) <= set("#%")


def split_predicted_length(text: str) -> tuple[str, int | None, str]:
    """Split 'Title(120): rest' into ('Title', 120, 'rest'); no length gives (text, None, '')."""
    for match in _HASH_LENGTH.finditer(text):
        after = text[match.end() :].lstrip()
        # Only a count that closes the title counts; "Sleep (8) hours" is prose.
        if after == "" or after[0] in ":.\u2026":
            rest = after.lstrip(":").strip().strip(".\u2026").strip()
            return text[: match.start()].strip(), int(match.group(1)), rest
    return text, None, ""


def strip_markdown(text: str) -> str:
    """Remove emphasis and code markers and surrounding quotes; keep the words."""
    for mark in ("**", "__", "`"):
        text = text.replace(mark, "")
    text = text.strip()
    if len(text) > 1 and text[0] in "*_" and text[-1] == text[0]:
        text = text[1:-1]
    return text.strip().strip("\"'\u201c\u201d\u2018\u2019").strip()


def collapse_spaces(text: str) -> str:
    """Join all whitespace runs, newlines included, into single spaces."""
    return " ".join(text.split())


def point_key(text: str) -> str:
    """A comparison key: case-folded letters and digits only, so 'Set goals.' == 'set goals'."""
    text = unicodedata.normalize("NFKC", text).casefold()
    kept = "".join(ch if ch.isalnum() else " " for ch in text)
    return " ".join(kept.split())


def has_words(text: str) -> bool:
    """True when the text contains at least one letter or digit."""
    return any(ch.isalnum() for ch in text)
