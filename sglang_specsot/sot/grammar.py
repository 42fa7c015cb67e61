"""Two word lists for how a point's title meets its body.

A branch continues after its pre-filled "**Title**:" and the 1.5B often goes on with the title as
the subject of its first sentence, across the colon ("**Nationalism**: is a feeling of ..."). The
merge joins such a body to its title without the colon (sot/merge.py); the benchmark's reader
counts what stays broken (bench/reading.py). Both read these lists, so they agree on one finding.
"""

from __future__ import annotations

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
