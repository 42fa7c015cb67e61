"""Controls a pairwise judge must pass before its verdicts count.

Control pairs are built from the normal answers themselves, so the better answer is known: each
answer against a copy with two of its points said again (rubric item 4, no repetition), against
a copy with its points' sentences moved among the points (item 5, reads as one answer), and
against another question's answer. The first two keep every word of the answer, so they are worse
whatever errors it holds; controls that deleted points were not (dropping a wrong point can make
an answer better). Each is asked in both orders. Only sound answers build controls: one that
loops already repeats itself, one cut at the token cap is unfinished, and one with fewer than
MIN_POINTS numbered points has too few to repeat or scramble. A judge counts only
if it prefers the real answer in at least CONTROL_BAR of the control askings and gives the same
verdict in both orders on at least CONSISTENCY_BAR of the real (SoT, normal) pairs. Pure: a
judge is any callable (question, answer A, answer B) -> "A" | "B" | "tie" | None.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_specsot.bench.endings import split_points
from sglang_specsot.sot.loops import find_loop

CONTROLS_FILE = "judge_controls.json"  # in a run directory: the judge's ControlScore and every asking
CONTROL_BAR = 0.9  # share of control askings that must prefer the real answer
CONSISTENCY_BAR = 0.8  # share of real pairs whose two orders must agree
REPEATED, OTHER_QUESTION, SCRAMBLED = "repeated points", "other question", "scrambled sentences"
KINDS = (REPEATED, OTHER_QUESTION, SCRAMBLED)
MIN_POINTS = 3  # fewer, and two repeated points are most of the answer
LOOPED, CUT, FEW_POINTS = "looped", "cut at the token cap", f"fewer than {MIN_POINTS} numbered points"

Judge = Callable[[str, str, str], "str | None"]


@dataclass(frozen=True, slots=True)
class NormalAnswer:
    """One question's normal answer and what the run recorded about how it ended."""

    question_id: int
    question: str
    answer: str
    finish_reason: str = ""  # "length": the answer hit the token cap
    looped: bool = False  # the run found its tail repeating (sot.loops.find_loop)


@dataclass(frozen=True, slots=True)
class ControlPair:
    """One question's normal answer (`real`) against a worse answer made from it (`control`)."""

    question_id: int
    kind: str  # one of KINDS
    question: str
    real: str
    control: str


@dataclass(frozen=True, slots=True)
class ControlVerdict:
    """The judge's word on one control pair in one order (`real_first`: the real answer is A)."""

    question_id: int
    kind: str
    real_first: bool
    word: str | None

    @property
    def prefers_real(self) -> bool:
        return self.word == ("A" if self.real_first else "B")


@dataclass(frozen=True, slots=True)
class ControlScore:
    """How a judge did on its controls and on the order test of the real pairs."""

    askings: int  # control pairs x 2 orders
    preferred_real: int
    real_pairs: int  # real (SoT, normal) pairs asked in both orders, answers different
    consistent: int  # ... whose two orders name the same answer (or both say tie)

    @property
    def control_share(self) -> float | None:
        return self.preferred_real / self.askings if self.askings else None

    @property
    def consistent_share(self) -> float | None:
        return self.consistent / self.real_pairs if self.real_pairs else None

    @property
    def passes(self) -> bool:
        """Both bars met; a judge with no controls or no real pairs does not pass."""
        control, consistent = self.control_share, self.consistent_share
        return control is not None and consistent is not None and control >= CONTROL_BAR and consistent >= CONSISTENCY_BAR


def unsound(normal: NormalAnswer) -> str | None:
    """Why `normal` cannot build controls (LOOPED, CUT or FEW_POINTS), or None if it can."""
    if normal.looped or find_loop(normal.answer) is not None:
        return LOOPED
    if normal.finish_reason == "length":
        return CUT
    if len(split_points(normal.answer)) < MIN_POINTS:
        return FEW_POINTS
    return None


def sound_answers(normals: Sequence[NormalAnswer]) -> tuple[list[NormalAnswer], dict[int, str]]:
    """The answers that can build controls, and {question_id: why not} for the rest."""
    reasons = {n.question_id: unsound(n) for n in normals}
    return [n for n in normals if reasons[n.question_id] is None], {q: r for q, r in reasons.items() if r}


def describe_sound(sound: int, excluded: dict[int, str]) -> str:
    """One line: how many normal answers built controls, and why the others did not."""
    why: dict[str, list[int]] = {}
    for qid, reason in sorted(excluded.items()):
        why.setdefault(reason, []).append(qid)
    parts = [f"{len(qids)} {reason} (questions {', '.join(map(str, qids))})" for reason, qids in why.items()]
    left = f"; left out: {'; '.join(parts)}" if parts else ""
    return f"Controls built from {sound} of {sound + len(excluded)} normal answers{left}."


def repeated_points(answer: str, rng: random.Random) -> str | None:
    """The whole answer with two of its numbered points (seeded) said again as extra points, each
    copy placed after its original, the points renumbered: the same content plus repetition.
    None with fewer than MIN_POINTS points."""
    layout = _layout(answer)
    if layout is None:
        return None
    opening, points, closing, sep = layout
    order = list(range(len(points)))
    for i in sorted(rng.sample(range(len(points)), 2), reverse=True):  # the later copy first keeps i's place
        order.insert(rng.randint(order.index(i) + 1, len(order)), i)
    return _render(opening, [points[i] for i in order], closing, sep)


def scrambled_sentences(answer: str, rng: random.Random) -> str | None:
    """The whole answer with its points' body sentences moved among the points (seeded; at least
    half land in another point); the opening, the numbered titles and the closing paragraph stay
    in place. Every sentence is there; it no longer reads as one answer. None with fewer than
    MIN_POINTS points or fewer than two body sentences."""
    layout = _layout(answer)
    if layout is None:
        return None
    opening, points, closing, sep = layout
    parsed = [_title_and_body(p) for p in points]
    units = [(i, u) for i, (_, body, inline) in enumerate(parsed) for u in _units(body, inline)]
    if len(units) < 2:
        return None
    bodies: list[list[tuple[str, bool]]] = [[] for _ in points]
    moved = set(rng.sample(range(len(units)), (len(units) + 1) // 2))
    for k, (i, unit) in enumerate(units):
        if k not in moved:
            bodies[i].append(unit)
    for k in sorted(moved):  # to a point left empty where one is, so no point reads as cut at its title
        i, unit = units[k]
        others = [j for j in range(len(points)) if j != i]
        bodies[rng.choice([j for j in others if not bodies[j]] or others)].append(unit)
    for body in bodies:
        rng.shuffle(body)
    return _render(opening, [_join(title, body, inline) for (title, _, inline), body in zip(parsed, bodies)], closing, sep)


# A point's title: its bold span (and a colon after it), else a short phrase ending in a colon.
_TITLE = re.compile(r"\d{1,2}[.)]\s+(?:\*\*[^*\n]+\*\*:?|[^.!?:\n]{1,80}:(?=\s|$))")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_LINE_START = re.compile(r"\s|[-*+>#|]|\d{1,3}[.)]\s|```")  # a unit that must begin its own line


def _layout(answer: str) -> tuple[str, list[str], str, str] | None:
    """(opening, points, closing paragraph, separator between points), or None with fewer than
    MIN_POINTS points. The closing paragraph is the last point's last paragraph when it starts
    at the line's start and no earlier point has a paragraph like it (then it is the body's)."""
    points = split_points(answer)
    if len(points) < MIN_POINTS:
        return None
    opening = answer[: answer.index(points[0])].strip()
    sep = "\n\n" if points[0].endswith("\n") else "\n"
    points = [p.strip() for p in points]
    head, _, tail = points[-1].rpartition("\n\n")
    closing = ""
    if head and not _LINE_START.match(tail) and not any(re.search(r"\n\n[^\s\-*+\d`]", p) for p in points[:-1]):
        if head.count("```") % 2 == 0:
            points[-1], closing = head.strip(), tail.strip()
    return opening, points, closing, sep


def _title_and_body(point: str) -> tuple[str, str, bool]:
    """(numbered title, body, whether the body began on the title's line). Without a bold or
    colon title, the point's first sentence is its title."""
    first, _, rest = point.partition("\n")
    match = _TITLE.match(first)
    number = len(re.match(r"\d{1,2}[.)]\s*", first).group())
    end = match.end() if match else number + len(_SENTENCE_END.split(first[number:], maxsplit=1)[0])
    inline = first[end:].strip()
    return first[:end].strip(), "\n".join(filter(None, [inline, rest])), bool(inline)


def _units(body: str, inline: bool) -> list[tuple[str, bool]]:
    """A body's sentences and list lines as (text, begins a line); a code block is one unit.
    `inline`: the body's first line went on from the title's line."""
    out: list[tuple[str, bool]] = []
    fence: list[str] = []
    for line in body.split("\n"):
        is_fence = line.strip().startswith("```")
        if fence or is_fence:
            fence.append(line)
            if is_fence and len(fence) > 1:
                out.append(("\n".join(fence), True))
                fence = []
            continue
        pieces = [p for p in _SENTENCE_END.split(line) if p.strip()]
        out += [(p.rstrip(), j == 0 and not (inline and not out)) for j, p in enumerate(pieces)]
    if fence:
        out.append(("\n".join(fence), True))
    return out


def _join(title: str, body: list[tuple[str, bool]], inline: bool) -> str:
    """A point from its title and body units: a unit goes on the line before it where it reads on
    from a sentence's end, else on a line of its own (indented if it would read as a point)."""
    text = title
    for k, (unit, line_start) in enumerate(body):
        starts_line = bool(_LINE_START.match(unit)) or (line_start and not (k == 0 and inline))
        if not starts_line and (text.endswith((".", "!", "?")) or (k == 0 and inline)):
            text += " " + unit
        else:
            text += "\n" + ("   " + unit if re.match(r"\d{1,2}[.)]\s", unit) else unit)
    return text


def _render(opening: str, points: list[str], closing: str, sep: str) -> str:
    numbered = [re.sub(r"^\d{1,2}(?=[.)])", str(i), p, count=1) for i, p in enumerate(points, 1)]
    return "\n\n".join(filter(None, [opening, sep.join(numbered), closing]))


def control_pairs(normals: Sequence[NormalAnswer], seed: int = 0) -> list[ControlPair]:
    """Every control kind for every sound answer of `normals` (see `sound_answers`); another
    question's answer is the next sound one's (so at least two are needed for that kind)."""
    rng = random.Random(seed)
    sound, _ = sound_answers(normals)
    out = []
    for i, normal in enumerate(sound):
        answer = normal.answer
        controls = {REPEATED: repeated_points(answer, rng), SCRAMBLED: scrambled_sentences(answer, rng)}
        if len(sound) > 1:
            controls[OTHER_QUESTION] = sound[(i + 1) % len(sound)].answer
        for kind in KINDS:
            if controls.get(kind) and controls[kind].strip() != answer.strip():
                out.append(ControlPair(normal.question_id, kind, normal.question, answer, controls[kind]))
    return out


def ask_controls(judge: Judge, pairs: Sequence[ControlPair]) -> list[ControlVerdict]:
    """Each control pair asked in both orders, real answer first, then second."""
    return [ask_control(judge, pair, real_first) for pair in pairs for real_first in (True, False)]


def ask_control(judge: Judge, pair: ControlPair, real_first: bool) -> ControlVerdict:
    """One control pair asked in one order (`real_first`: the real answer shown as A)."""
    a, b = (pair.real, pair.control) if real_first else (pair.control, pair.real)
    return ControlVerdict(pair.question_id, pair.kind, real_first, judge(pair.question, a, b))


def order_consistent(first: str | None, second: str | None) -> bool:
    """Whether two orders of one pair agree: `first` with answer X shown as A, `second` with X
    shown as B. No answer (None) in either order is not agreement."""
    swap = {"A": "B", "B": "A", "tie": "tie"}
    return first is not None and second is not None and swap.get(first) == second


def score(controls: Sequence[ControlVerdict], real: Sequence[tuple[str | None, str | None]]) -> ControlScore:
    """The ControlScore of control verdicts and real pairs' (SoT-first word, normal-first word)."""
    return ControlScore(len(controls), sum(v.prefers_real for v in controls),
                        len(real), sum(order_consistent(a, b) for a, b in real))  # fmt: skip


def by_kind(controls: Sequence[ControlVerdict]) -> dict[str, tuple[int, int]]:
    """{kind: (askings preferring the real answer, askings)}."""
    out: dict[str, tuple[int, int]] = {}
    for v in controls:
        hits, n = out.get(v.kind, (0, 0))
        out[v.kind] = (hits + v.prefers_real, n + 1)
    return out


def describe(judge_name: str, result: ControlScore | None) -> str:
    """One line for beside a verdict table: the judge, its control scores, whether it counts."""
    if result is None:
        return f"Judge {judge_name or '(unnamed)'}: no controls run, so its verdicts do not count."
    control = (f"prefers the real answer in {result.preferred_real}/{result.askings} control askings "
               f"({result.control_share:.0%})" if result.askings else "no control pair asked")  # fmt: skip
    consistent = (f"same verdict in both orders on {result.consistent}/{result.real_pairs} real pairs "
                  f"({result.consistent_share:.0%})" if result.real_pairs else "no real pair asked in both orders")  # fmt: skip
    verdict = "passes: its verdicts count" if result.passes else "FAILS: its verdicts do not count"
    return (f"Judge {judge_name or '(unnamed)'}: {control} (bar {CONTROL_BAR:.0%}); {consistent} "
            f"(bar {CONSISTENCY_BAR:.0%}); {verdict}.")  # fmt: skip


def load_controls(out: Path) -> tuple[str, ControlScore] | None:
    """(judge name, ControlScore) from out/judge_controls.json; None if the run has none."""
    path = out / CONTROLS_FILE
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record.get("judge", ""), ControlScore(**record["score"])
