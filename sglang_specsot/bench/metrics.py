"""Answer-quality measures that need no model: sentence split, coverage from a similarity
matrix, length ratio, completeness of enumerated asks, and the judge's verdict logic."""

from __future__ import annotations

import re
from collections.abc import Sequence

from sglang_specsot.sot.asks import covered, enumerated_items

# A sentence of the normal answer counts as covered when some sentence of the other answer is
# at least this similar (cosine of all-MiniLM-L6-v2 embeddings; paraphrases score ~0.6-0.9,
# unrelated sentences of one topic ~0.2-0.5).
COVER_THRESHOLD = 0.6
MIN_SENTENCE_WORDS = 3
_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
_DECOR = re.compile(r"^\s*(?:[-*#>]+|\d+[.)])\s*")
WIN, TIE, LOSS = "win", "tie", "loss"
# Calibrated verdict: half the difference of log P(A) - log P(B) between the two orders is the
# judge's preference for the SoT answer with an additive position bias cancelled (Wang et al.
# 2023, "Large Language Models are not Fair Evaluators": balanced position calibration).
# Within +-CALIBRATED_TIE nats it is a tie.
CALIBRATED_TIE = 0.1


def sentences(text: str) -> list[str]:
    """Sentences and list lines, numbering and markdown stripped, fragments under 3 words dropped."""
    out = []
    for piece in _SPLIT.split(text):
        piece = _DECOR.sub("", piece.replace("**", "")).strip()
        if len(piece.split()) >= MIN_SENTENCE_WORDS:
            out.append(piece)
    return out


def coverage(similarity: Sequence[Sequence[float]], threshold: float = COVER_THRESHOLD) -> float | None:
    """Share of rows (sentences of the answer being covered) whose best match among the columns
    (the covering answer's sentences) reaches `threshold`; None when there are no rows."""
    if not similarity:
        return None
    hits = sum(1 for row in similarity if row and max(row) >= threshold)
    return hits / len(similarity)


def matched_coverage(similarity: Sequence[Sequence[float]], threshold: float = COVER_THRESHOLD) -> float | None:
    """Like `coverage`, but one to one: the share of rows matched to distinct columns at
    `threshold` or more (a maximum bipartite matching); None when there are no rows.

    `coverage` lets one sentence cover every sentence like it, so an answer's intro and
    summary, or list items of one shape, are covered by any one of them: the first half of a
    normal answer can cover more of it than a complete second normal answer does. Matched one
    to one, half an answer covers about half (`quality.controls` measures both on a run).
    """
    if not similarity:
        return None
    edges = [[c for c, s in enumerate(row) if s >= threshold] for row in similarity]
    owner: dict[int, int] = {}  # column -> the row it covers

    def augment(r: int, seen: set[int]) -> bool:  # Kuhn's augmenting path from row r
        for c in edges[r]:
            if c not in seen:
                seen.add(c)
                if c not in owner or augment(owner[c], seen):
                    owner[c] = r
                    return True
        return False

    return sum(augment(r, set()) for r in range(len(edges))) / len(edges)


def length_ratio(answer: str, reference: str) -> float | None:
    """Words of `answer` over words of `reference` (None for an empty reference)."""
    ref = len(reference.split())
    return len(answer.split()) / ref if ref else None


def completeness(question: str, answer: str) -> tuple[int, float | None]:
    """(items the question enumerates, share of them the answer addresses); share None if none."""
    items = enumerated_items(question)
    if not items:
        return 0, None
    hits = covered(items, answer)
    return len(items), sum(hits) / len(items)


def parse_verdict(text: str) -> str | None:
    """'A', 'B' or 'tie' from a judge's reply (its first such word), None if it gave none."""
    match = re.search(r"\b(A|B|tie|TIE|Tie)\b", text)
    if match is None:
        return None
    word = match.group(1)
    return "tie" if word.lower() == "tie" else word


def combine_verdicts(sot_first: str | None, normal_first: str | None) -> str:
    """SoT's result from two orders (SoT shown as A, then as B); disagreement is a tie."""
    first = {"A": WIN, "B": LOSS}.get(sot_first or "", TIE)
    second = {"B": WIN, "A": LOSS}.get(normal_first or "", TIE)
    return first if first == second else TIE


def calibrated_verdict(sot_first_margin: float | None, normal_first_margin: float | None,
                       band: float = CALIBRATED_TIE) -> str:  # fmt: skip
    """SoT's result from log P(A) - log P(B) in both orders (SoT shown as A, then as B)."""
    if sot_first_margin is None or normal_first_margin is None:
        return TIE
    preference = (sot_first_margin - normal_first_margin) / 2
    return WIN if preference > band else LOSS if preference < -band else TIE
