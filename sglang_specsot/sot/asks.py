"""What a question explicitly asks for by name: "compare bubble sort, quick sort and merge sort".

A skeleton that plans three of six named algorithms gives an answer that silently drops the
rest, however well each point is written. `enumerated_items` finds the items a question
lists (three or more in a series, so "X and Y" comparisons, which plan well by aspect, are
left alone); `covered` says whether a text addresses an item; `cover_asks` adds the items a
plan misses as points of their own. Heuristic and plain Python; the benchmark uses the same
functions to score completeness.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Sequence

from sglang_specsot.sot.config import DEFAULT_CONFIG, SoTConfig
from sglang_specsot.sot.skeleton import PLAN, SkeletonParse, SkeletonPoint

MIN_ITEMS = 3  # a series of this many named items is an explicit ask
MAX_ITEM_WORDS = 4  # longer "items" are clauses, not names
_CLAUSES = re.compile(r"[?!;:()\n]|\.(?=\s|$)")
_CONJ = re.compile(r"(?:^|\s)(?:and|or)\s+", re.IGNORECASE)
_ARTICLES = frozenset(("a", "an", "the"))
_TRAILING = re.compile(r"\s+(?:in|for|with|using|on|from|to|by|at|when|while|as|into)\s.*$", re.IGNORECASE)
# Words that open a list inside a sentence; what they lead into is the first item.
_LEAD = re.compile(
    r"^(?:.*\s)?(?:discuss(?:ing)?|highlighting|including|covering|such as|like|especially|namely|"
    r"e\.g\.)\s+(?:(?:its|their|the|his|her|our|your)\s+)?",
    re.IGNORECASE,
)
_CLAUSE_WORDS = frozenset("what how why when where who which is are was were do does did can should would".split())
_WORD = re.compile(r"[\w+#'-]+")
_STOP = frozenset(
    "a an the of to in on for and or with by at as is are be its their your my our this that these "
    "those what which how why when where who whom whose do does did can could should would will "
    "about between among including such like vs versus e.g etc".split()
)


def enumerated_items(question: str) -> tuple[str, ...]:
    """The items the question lists in a series of MIN_ITEMS or more, in order; () if none."""
    for clause in _CLAUSES.split(question or ""):
        items = _series(clause)
        if len(items) >= MIN_ITEMS:
            return items
    return ()


def _series(clause: str) -> tuple[str, ...]:
    parts = _parts(_without_tail(clause))
    if len(parts) < MIN_ITEMS:
        return ()
    # The series starts at the last part that opens a list ("discussing its plot") or holds a
    # conjunction of its own ("the climate, wildlife and people of the Sahara, ..."): what
    # precedes it is another phrase, not items.
    start = max((i for i, p in enumerate(parts[:-1]) if i == 0 or _LEAD.match(p) or _CONJ.search(p)), default=0)
    middle = parts[start + 1 : -1]
    if not middle or any(len(_WORD.findall(p)) > MAX_ITEM_WORDS for p in middle):
        return ()
    width = max(len(_WORD.findall(p)) for p in middle)
    # After "do"/"did"/"can" ... the verb that follows the series may end the clause ("How do
    # A, B and C differ?"); otherwise a final word is taken as part of the item ("... and
    # hybrid work").
    verb_may_end = bool(_AUXILIARIES & {w.lower() for w in _WORD.findall(" ".join(parts[: start + 1]))})
    items = [_first_item(parts[start], width), *middle, _last_item(parts[-1], verb_may_end)]
    if _modifies_one_noun(parts[start], items, width):
        return ()
    for item in items:
        words = {w.lower() for w in _WORD.findall(item)}
        if not _content_words(item) or len(words) > MAX_ITEM_WORDS or words & _CLAUSE_WORDS:
            return ()  # a clause ("what is herd immunity"), not a name
    return tuple(item.strip(" .,'\"") for item in items)


def _parts(clause: str) -> list[str]:
    """The comma-separated parts of a clause, its last split at the series' own "and"/"or"
    ("A, B and C" and "A, B, and C" both give [A, B, C]; a bare list "A, B, C" too)."""
    *body, last = [c.strip() for c in clause.split(",")]
    conj = _CONJ.search(last)
    if conj is None:
        return [c for c in (*body, last) if c] if len(body) >= 2 else []
    before, after = last[: conj.start()].strip(), last[conj.end() :].strip()
    return [c for c in (*body, before, after) if c]


def _first_item(part: str, width: int) -> str:
    """The first item: what follows a list opener, else as many final words as the widest
    middle item, without leading function words ("How do photosynthesis" -> "photosynthesis")."""
    if _LEAD.match(part):
        return _LEAD.sub("", part)
    words = part.split()[-width:]
    # An auxiliary goes ("do"), and an inflected verb ("What makes Tokyo, Paris, New York");
    # a copula stays and rejects the item ("Which is healthier, A or B").
    while len(words) > 1 and words[0].lower() in _DROPPED_BEFORE_FIRST:
        words = words[1:]
    return " ".join(words)


def _last_item(part: str, verb_may_end: bool) -> str:
    """The last item without what the sentence goes on with: a preposition's phrase ("for a
    small town") or a predicate ("the telephone change everyday life", "China powerful")."""
    words = _TRAILING.sub("", part).split()
    for i, word in enumerate(words[1:], 1):
        word = word.lower().strip(".,'\"")
        if word in _COMPLEMENTS or (word in _VERBS and (i < len(words) - 1 or verb_may_end)):
            return " ".join(words[:i])
    return " ".join(words)


def _modifies_one_noun(first_part: str, items: list[str], width: int) -> bool:
    """Whether the "items" are adjectives of one noun: "a short, friendly and clear message".
    One article before a series of bare words governs one noun; a series of things repeats
    its article ("a cat, a dog or a rabbit") or has none ("cats, dogs and rabbits")."""
    before = first_part.split()[:-width]
    return bool(before) and before[-1].lower() in ("a", "an") and not any(
        i.split()[0].lower() in _ARTICLES for i in items[1:]
    )


def _without_tail(clause: str) -> str:
    """The clause without what follows its last item: "A, B and C in terms of speed and
    memory use" -> "A, B and C", so the tail's own "and" is not read as one more item."""
    head, comma, last = clause.rpartition(",")
    kept = _TRAILING.sub("", last)
    # Only after a series' own last "and"/"or" ("B and C in ..."); a tail clause after the
    # series (", without relying on ...") is no item, cut or not.
    return head + comma + kept if comma and _CONJ.search(kept) else clause


def _verb_forms(bases: str, irregular_bases: str, irregular_forms: str) -> frozenset[str]:
    """Bases, their -s forms, -ed for the regular ones, and the irregular forms given."""
    irregular = set(irregular_bases.split())
    forms = set(irregular_forms.split()) | irregular
    for verb in bases.split():
        forms |= {verb, verb + ("es" if verb.endswith(("s", "sh", "ch", "x", "o")) else "s")}
        if verb not in irregular:
            forms.add((verb[:-1] if verb.endswith("e") else verb) + "ed")
    return frozenset(forms)


# Where a series' last item ends and the sentence goes on: "How did A, B and the telephone
# change everyday life". About a hundred of the most frequent English verbs, plus the ones
# questions about several things use to relate them (differ, compare, affect, ...): general
# English, not words picked from a question set.
_IRREGULAR = (
    "be have do say go get make know think take see come give tell feel become leave put mean keep "
    "let begin hold bring write sit stand lose pay meet set lead understand speak read grow win "
    "buy send build fall cut sell run find hear spend try stop"
)
_VERB_BASES = _IRREGULAR + (
    " want look use work call ask need seem help talk turn start show play move like "
    "live believe happen provide include continue learn change watch follow stop create allow add "
    "open walk offer remember love consider appear wait serve die expect stay reach kill "
    "remain suggest raise pass require report decide pull differ compare affect influence "
    "contribute shape impact interact relate matter"
)
_VERBS = _verb_forms(
    _VERB_BASES,
    _IRREGULAR,
    "is are was were been has had does did said went gone got made knew known thought took taken "
    "saw seen came gave given told felt became left meant kept began begun held brought wrote "
    "written sat stood lost paid met led understood spoke spoken grew grown won bought sold "
    "fell fallen built sent ran found heard spent tried tries stopped",
)
_COPULAS = frozenset("is are was were be".split())
_INFLECTED = _VERBS - _COPULAS - frozenset(_VERB_BASES.split())
# Adjectives a question puts after what it names ("What made A, B and C powerful?").
_COMPLEMENTS = frozenset(
    "powerful successful popular important famous different similar alike better worse".split()
)
_AUXILIARIES = frozenset("do does did can could will would should may might must".split())
# Leading words that are no part of a first item: function words bar articles and copulas,
# and inflected verbs.
_DROPPED_BEFORE_FIRST = (_STOP - _ARTICLES - _COPULAS) | _INFLECTED


def _content_words(text: str) -> set[str]:
    return {w for w in (m.lower().strip("'-") for m in _WORD.findall(text)) if w and w not in _STOP}


def distinctive_words(items: Sequence[str]) -> list[set[str]]:
    """Each item's content words that no other item shares ("bubble" in "bubble sort")."""
    words = [_content_words(item) for item in items]
    out = []
    for i, own in enumerate(words):
        others = set().union(*(w for j, w in enumerate(words) if j != i))
        out.append(own - others or own)
    return out


def covered(items: Sequence[str], text: str) -> list[bool]:
    """Whether `text` mentions each item (by one of its distinctive words)."""
    present = _content_words(text)
    return [bool(words & present) for words in distinctive_words(items)]


def derived_parse(question: str, config: SoTConfig = DEFAULT_CONFIG) -> SkeletonParse | None:
    """The plan a question states itself: its enumerated items, one point each; None when it
    names fewer than MIN_ITEMS, more than `max_points`, or `derive_skeleton` is off."""
    items = enumerated_items(question)
    if not config.derive_skeleton or not MIN_ITEMS <= len(items) <= config.max_points:
        return None
    points = tuple(SkeletonPoint(item[:1].upper() + item[1:]) for item in items)
    note = f"the question names {len(items)} items: they are the points, no skeleton was generated"
    return SkeletonParse(PLAN, points, f"{len(points)} points", "numbered", (note,))


def cover_asks(parse: SkeletonParse, question: str, config: SoTConfig = DEFAULT_CONFIG) -> SkeletonParse:
    """The plan with a point added for every item the question lists that no point names.

    Items outrank unnamed points when the plan would exceed `max_points`: the answer must
    cover what was asked first.
    """
    items = enumerated_items(question)
    if not parse.is_plan or not items:
        return parse
    words = distinctive_words(items)
    missing = [item for item, own in zip(items, words) if not any(own & _content_words(p.text) for p in parse.points)]
    if not missing:
        return parse
    named = [p for p in parse.points if any(own & _content_words(p.text) for own in words)]
    others = [p for p in parse.points if p not in named]
    room = max(0, config.max_points - len(named) - len(missing))
    keep = set(map(id, named + others[:room]))
    points = [p for p in parse.points if id(p) in keep] + [SkeletonPoint(item) for item in missing]
    notes = parse.notes + (f"added points the question names: {missing}",)
    if len(points) > config.max_points:
        notes += (f"kept the first {config.max_points} of {len(points)} points",)
        points = points[: config.max_points]
    flagged = {id(parse.points[i]) for i in parse.long_points}
    long_points = tuple(i for i, p in enumerate(points) if id(p) in flagged)
    return dataclasses.replace(parse, points=tuple(points), reason=f"{len(points)} points", notes=notes,
                               long_points=long_points)  # fmt: skip


# -- Scoring the extractor against hand labels -------------------------------------------------
# A set's rows carry "items": the names a reader sees listed, [] for none; "a|b" accepts either
# form ("solar|solar power"). Articles and case are ignored.

_ARTICLE = re.compile(r"^(?:a|an|the)\s+", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class ItemAgreement:
    """How `enumerated_items` agrees with a labelled set, and where it does not."""

    n: int
    exact: int  # the same items (in any order), or none where the label has none
    false_series: int  # found items where the label has none
    missed: int  # found none where the label has some
    wrong: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]  # (question, found, labelled)


def _norm(item: str) -> str:
    return _ARTICLE.sub("", " ".join(item.lower().strip(" .,'\"").split()))


def items_agree(found: Sequence[str], labelled: Sequence[str]) -> bool:
    """Whether the found items are the labelled ones, each matching one label's alternatives."""
    if len(found) != len(labelled):
        return False
    left = [{_norm(form) for form in label.split("|")} for label in labelled]
    for item in found:
        match = next((forms for forms in left if _norm(item) in forms), None)
        if match is None:
            return False
        left.remove(match)
    return True


def evaluate_items(rows: Sequence[dict]) -> ItemAgreement:
    """Score `enumerated_items` on rows with "question" and "items" (a list of strings)."""
    exact = false_series = missed = 0
    wrong = []
    for row in rows:
        labelled = row.get("items")
        if not isinstance(labelled, list) or not all(isinstance(i, str) and i.strip() for i in labelled):
            raise ValueError(f"question {row['question']!r}: needs \"items\", a list of non-empty strings "
                             f"([] when it names none), got {labelled!r}")  # fmt: skip
        found = enumerated_items(row["question"])
        if items_agree(found, labelled):
            exact += 1
            continue
        false_series += bool(found and not labelled)
        missed += bool(labelled and not found)
        wrong.append((row["question"], found, tuple(labelled)))
    return ItemAgreement(len(rows), exact, false_series, missed, tuple(wrong))


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m sglang_specsot.sot.asks eval FILE|NAME`: each disagreement on one line, then
    {"n", "exact", "false_series", "missed"} as the last line."""
    from sglang_specsot.data import load_questions

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "eval":
        raise SystemExit("usage: python -m sglang_specsot.sot.asks eval FILE.jsonl|NAME "
                         '(lines {"question": ..., "items": [...]})')  # fmt: skip
    try:
        result = evaluate_items(load_questions(args[1]))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    # The command's output, not library logging.
    for question, found, labelled in result.wrong:
        sys.stdout.write(f"{question!r}: found {list(found)}, labelled {list(labelled)}\n")
    line = {"n": result.n, "exact": round(result.exact / result.n, 4) if result.n else None,
            "false_series": result.false_series, "missed": result.missed}  # fmt: skip
    sys.stdout.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
