"""Crude word stems: enough to see a title's words again in another title or sentence.

Lower case, a possessive and one common suffix cut, stop words left out. Shared by the skeleton
parser (two titles of one idea are one point) and the benchmark's reading of answers.
"""

from __future__ import annotations

import re

WORD = re.compile(r"[A-Za-z][A-Za-z']*")
_SUFFIXES = ("ities", "ity", "ness", "ments", "ment", "ings", "ing", "ions", "ion", "ies", "ed", "es", "ly", "s", "e", "y")
_STOP = frozenset(
    "a an the and or but nor of to in on at by for with from into as than that which who whom whose this these those "
    "it its it's is are was were be been being am do does did can could should would will may might must shall "
    "you your yours i me my we our us they them their he she his her there here what how why when where "
    "not no so if then also just very more most some any such about over under up out own each other all "
    "one two first-time".split()
)
# Two titles whose stems overlap this much (Jaccard), or one holding all of the other's, are one idea.
TITLE_OVERLAP = 0.6


def stem(word: str) -> str:
    """A crude stem: lower case, possessive and one common suffix cut, at least 3 letters kept."""
    word = word.lower().removesuffix("'s").strip("'")
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def content_stems(text: str, drop: frozenset[str] = frozenset()) -> set[str]:
    """Stems of the words of `text` that carry content (stop words and `drop` left out)."""
    words = (w.lower() for w in WORD.findall(text))
    return {stem(w) for w in words if w not in _STOP and w not in drop}



def same_idea(a: set[str], b: set[str]) -> bool:
    """Whether two titles' stem sets name one idea: one holds the other ("Entertainment",
    "Entertainment options") or they share TITLE_OVERLAP of their stems."""
    if not a or not b:
        return False
    return a <= b or b <= a or len(a & b) >= TITLE_OVERLAP * len(a | b)
