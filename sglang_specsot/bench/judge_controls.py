"""Controls a pairwise judge must pass before its verdicts count.

Control pairs are built from the normal answers themselves, so the better answer is known: the
answer against its opening and the first half of its points (it stops partway through its
list), against another question's answer, and against a copy with its points shuffled and half
of them deleted. Each is asked in both orders. Only sound answers build controls: one that
loops, was cut at the token cap or has fewer than MIN_POINTS numbered points may be no better
than its own first half, so the control would not be worse by construction. A judge counts only
if it prefers the real answer in at least CONTROL_BAR of the control askings and gives the same
verdict in both orders on at least CONSISTENCY_BAR of the real (SoT, normal) pairs. Pure: a
judge is any callable (question, answer A, answer B) -> "A" | "B" | "tie" | None.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_specsot.bench.endings import split_points
from sglang_specsot.sot.loops import find_loop

CONTROLS_FILE = "judge_controls.json"  # in a run directory: the judge's ControlScore and every asking
CONTROL_BAR = 0.9  # share of control askings that must prefer the real answer
CONSISTENCY_BAR = 0.8  # share of real pairs whose two orders must agree
FIRST_HALF, OTHER_QUESTION, SHUFFLED_HALF = "first half of the points", "other question", "shuffled half"
KINDS = (FIRST_HALF, OTHER_QUESTION, SHUFFLED_HALF)
MIN_POINTS = 3  # fewer, and half the points is one point: too close to a short complete answer
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


def first_half(answer: str) -> str:
    """The answer's opening and the first half of its numbered points (rounded down, at least
    one), whole and as written: it stops partway through its list, and its closing paragraph,
    which goes with its last point, is gone."""
    points = split_points(answer)
    keep = max(1, len(points) // 2)
    if keep == len(points):
        return answer.strip()
    start = 0
    for point in points[: keep + 1]:  # split_points' points are the answer's lines, in order
        start = answer.index(point, start)
    return answer[:start].strip()


def shuffled_half(answer: str, rng: random.Random) -> str | None:
    """The answer's opening, then half its numbered points (rounded down) in shuffled order and
    renumbered; its closing paragraph goes with its last point. None with fewer than 2 points."""
    points = split_points(answer)
    if len(points) < 2:
        return None
    opening = answer[: answer.index(points[0])].strip()
    kept = rng.sample(points, len(points) // 2)
    body = [f"{i}. {_unnumbered(p)}" for i, p in enumerate(kept, 1)]
    return "\n\n".join(([opening] if opening else []) + body)


def _unnumbered(point: str) -> str:
    return point.split(" ", 1)[1] if " " in point else point


def control_pairs(normals: Sequence[NormalAnswer], seed: int = 0) -> list[ControlPair]:
    """Every control kind for every sound answer of `normals` (see `sound_answers`); another
    question's answer is the next sound one's (so at least two are needed for that kind)."""
    rng = random.Random(seed)
    sound, _ = sound_answers(normals)
    out = []
    for i, normal in enumerate(sound):
        answer = normal.answer
        controls = {FIRST_HALF: first_half(answer), SHUFFLED_HALF: shuffled_half(answer, rng)}
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
