"""How a point's title meets its body: two word lists and the test for a restating sentence.

A branch continues after its pre-filled "**Title**:" and the 1.5B often goes on with the title as
the subject of its first sentence, across the colon ("**Nationalism**: is a feeling of ..."), or
opens by saying again what its title or the question says ("Prioritizing tasks is crucial for
managing time effectively."). The merge joins the first to its title without the colon and drops
the second where more follows (sot/merge.py); the benchmark's reader counts what stays
(bench/reading.py). Both read these definitions, so they agree on one finding.
"""

from __future__ import annotations

import re

from sglang_specsot.sot.stems import content_stems

# Finite verbs a body opens on, lower case, when it continues the title as its subject.
FINITE = frozenset("is are was were can will helps help allows plays makes keeps ensures provides means".split())
# A title starting with one of these is an instruction ("Take breaks"): continued as a subject it
# reads as glued grammar ("Take breaks are crucial"), so no join can mend it.
IMPERATIVE = frozenset(
    "add adjust ask attend avoid be book break bring budget build celebrate check choose clean comment "
    "communicate compare consider create declutter define delegate develop do dress eat eliminate embrace "
    "ensure establish explore find focus follow get give identify improve increase invest join keep know "
    "learn limit list listen look maintain make manage meditate minimize monitor negotiate network offer "
    "organize pack plan practice practise prepare prioritize protect provide read reduce research respect "
    "rest review reward save schedule seek set sleep start stay take talk test track travel try understand "
    "update use verify visit write".split()
)


def is_instruction(title_words: list[str]) -> bool:
    """Whether a title (its words) is an instruction: an imperative verb and something more
    ("Take breaks", "Set a timer"). One word alone is read as a noun ("Sleep", "Research"): it
    can be the subject of a sentence."""
    return len(title_words) > 1 and title_words[0].lower() in IMPERATIVE


# Words that carry no content of their own when a point opens with them ("X is a crucial step").
FILLER = frozenset(
    "crucial important essential significant key vital critical major powerful effective great good "
    "aspect step way part factor practice thing role skill help helps ensure make makes making "
    "consider considering like well many much several various often".split()
)
# Words a question is made of that its answer need not repeat to restate it.
QUESTION_WORDS = frozenset("tip tips ways best give list explain describe name suggest recommend".split())
MAX_NEW_STEMS = 2  # a restating sentence adds at most this many content stems of its own
RESTATE_SHARE = 2 / 3  # ... and holds at least this share of the title's (or question's) stems
# ... or says of them only that they matter: "Writing clear, concise code is crucial for ...".
MATTERS = re.compile(r"\b(?:is|are)\s+(?:(?:a|an|the)\s+)?(?:\w+\s+)?(?:crucial|important|essential|significant|key|"
                     r"vital|critical|powerful|effective|great|major)\b", re.IGNORECASE)  # fmt: skip


def restates(sentence: str, title: str, question: str) -> bool:
    """Whether `sentence` says little beyond the title or the question: it holds most of the
    stems of either, and at most MAX_NEW_STEMS content stems of its own or only that they matter."""
    new, holds = _against(sentence, title, question)
    return holds and (len(new) <= MAX_NEW_STEMS or bool(MATTERS.search(sentence)))


# A sentence the merge may drop adds at most this many content stems, or MAX_NEW_STEMS where all
# it says of them is that they matter: "The legislative branch is responsible for making laws."
# adds two (responsible, laws) and is the point's whole definition.
MAX_DROPPED_NEW_STEMS = 1
# A sentence opening on one of these leans on the one before it ("This is because ..."), so the
# one before it stays.
LEANS_BACK = re.compile(r"^(?:this|that|it|which)\s+(?:is|was)\s+(?:because|why|due)\b|^(?:because|therefore|thus|so|"
                        r"however|but|and|also|additionally|moreover|furthermore|in addition|as a result)\b",
                        re.IGNORECASE)  # fmt: skip


def says_nothing_new(sentence: str, title: str, question: str) -> bool:
    """Whether `sentence` holds the title's or the question's stems and adds at most
    MAX_DROPPED_NEW_STEMS of its own, or MAX_NEW_STEMS while saying they matter ("Prioritizing
    tasks is crucial for managing time effectively."): stricter than `restates`, which also
    counts a sentence that says a thing matters and then why ("Sleep is essential because ...")."""
    new, holds = _against(sentence, title, question)
    return holds and (len(new) <= MAX_DROPPED_NEW_STEMS or (len(new) <= MAX_NEW_STEMS and bool(MATTERS.search(sentence))))


def _against(sentence: str, title: str, question: str) -> tuple[set[str], bool]:
    """(the sentence's content stems found in neither the title nor the question, whether it
    holds RESTATE_SHARE of the title's or of the question's)."""
    words = content_stems(sentence, FILLER)
    title_stems, question_stems = content_stems(title, FILLER), content_stems(question, FILLER | QUESTION_WORDS)
    holds = any(stems and len(stems & words) >= RESTATE_SHARE * len(stems) for stems in (title_stems, question_stems))
    return words - title_stems - question_stems, holds
