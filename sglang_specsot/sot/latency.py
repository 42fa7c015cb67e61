"""Whether an SoT answer would come sooner than the normal answer on this server, now.

SoT gains only where a forward of k rows costs much less than k forwards of one row, and only
while the server has rows to spare. From the server's measured row-cost curve (`RowCosts`: a
forward's milliseconds by the rows it carries), its running batch and queue (`ServerLoad`) and
the answer's expected lengths (`AnswerShape`), `decide` predicts both answers:

    shared    = running + waiting (at most the server's max_running - 1): the other requests
                whose forwards the answer joins
    step(r)   = the curve at r rows;  prefill(n) = step(n): a prompt of n tokens is one forward
    normal_ms = (shared + 1) * prefill(P) + N * step(shared + 1)
    sot_ms    = (shared + 1) * (prefill(Ps) + prefill(Pb) + prefill(b * SUFFIX))
              + S * step(shared + 1)                                     the skeleton
              + sum over branch segments of steps * step((shared + 1) * n)
                n branches decoding at once, at most k = min(b, max_running, the free slots),
                longest first, a waiting one starting as one ends

and routes SoT where `sot_ms <= (1 - margin) * normal_ms`. Both are priced as a policy, not as
one request: were SoT right for this answer it would be right for each of the `shared` requests
like it, so the batch it is priced in is the one where each of them runs the same rows and
prefills the same prompts. One request alone would otherwise look faster on any busy server
by taking a larger share of every forward from the others, which on a curve linear in rows is
no saving at all. With no other request (`shared` = 0) the prediction is this answer's own time;
as the batch grows on a curve that rises with rows SoT steps aside, and comes back as it drains.

Plain Python, no SGLang or torch: the serving layer measures (the start-up probe, SGLang's load
snapshot) and this module only predicts.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from sglang_specsot.sot.budget import (
    HALF_SENTENCE_TOKENS,
    POINT_AIM_TOKENS,
    expected_tokens,
    fit_plan,
    point_target,
    skeleton_budget,
)
from sglang_specsot.sot.config import SoTConfig
from sglang_specsot.sot.planner import Branch, BranchPlan, branch_budget

# SoT is chosen only where its predicted time is at most (1 - MARGIN) of the normal answer's:
# the lengths it prices are expectations, so a near tie goes to the answer that reads best.
MARGIN = 0.15
# Tokens of a branch prompt's own last line ('Write only point 3, "..."'), prefilled per branch
# after the shared part (sot/prompts.py expansion_prompt).
BRANCH_SUFFIX_TOKENS = 16


@dataclass(frozen=True, slots=True)
class RowCosts:
    """A forward's time in ms by the rows it carries: `ms` at each of `rows` (the start-up
    probe's rows-dependent part, costs/probe.py) plus `overhead_ms`, which does not grow with
    rows (learned from observed steps). Between measured counts the curve is interpolated,
    beyond the last it goes on with the last slope, below the first it is the first."""

    rows: tuple[int, ...]  # increasing positive row counts
    ms: tuple[float, ...]  # the forward's rows-dependent ms at each
    overhead_ms: float = 0.0
    source: str = "probe"  # where the numbers came from, for the decision's record

    def __post_init__(self) -> None:
        if not self.rows or len(self.rows) != len(self.ms):
            raise ValueError(
                f"a row-cost curve needs one ms per row count and at least one point, got rows="
                f"{self.rows!r}, ms={self.ms!r}; pass the start-up probe's probe_rows and probe_ms"
            )
        counts = all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in self.rows)
        if not counts or list(self.rows) != sorted(set(self.rows)):
            raise ValueError(f"rows={self.rows!r} must be increasing positive integers, e.g. (1, 4, 8)")
        for name, values in (("ms", self.ms), ("overhead_ms", (self.overhead_ms,))):
            bad = [v for v in values if not _finite(v) or v < 0]
            if bad:
                raise ValueError(f"{name}={values!r} has {bad[0]!r}: forward times must be finite, non-negative "
                                 "milliseconds; re-run the probe")  # fmt: skip

    def step_ms(self, rows: int) -> float:
        """One forward of `rows` rows (a decode step of that many requests, or a prefill of that
        many tokens); never cheaper than fewer rows."""
        xs, ys = self.rows, self.ms
        if len(xs) == 1:
            return self.overhead_ms + ys[0] * max(1.0, rows / xs[0])
        i = min(max(bisect.bisect_left(xs, rows), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        if rows <= x0:
            return self.overhead_ms + y0
        return self.overhead_ms + max(y0, y0 + (y1 - y0) * (rows - x0) / (x1 - x0))

    def info(self) -> dict:
        return {"rows": list(self.rows), "ms": [round(m, 3) for m in self.ms],
                "overhead_ms": round(self.overhead_ms, 3), "source": self.source}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """What the scheduler is doing: requests decoding in its running batch, requests queued for
    it, and the most it runs at once (None: unknown, taken as unbounded)."""

    running: int = 0
    waiting: int = 0
    max_running: int | None = None

    def __post_init__(self) -> None:
        for name in ("running", "waiting"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}={value!r} must be a non-negative request count")
        cap = self.max_running
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise ValueError(f"max_running={cap!r} must be a positive request count or None (unknown)")

    @property
    def shared(self) -> int:
        """The other requests an answer admitted now shares its forwards with."""
        rows = self.running + self.waiting
        return rows if self.max_running is None else min(rows, self.max_running - 1)

    @property
    def free_slots(self) -> int | None:
        """Requests the scheduler could add to its batch now (None: unbounded)."""
        return None if self.max_running is None else max(0, self.max_running - self.running - self.waiting)


@dataclass(frozen=True, slots=True)
class AnswerShape:
    """The expected lengths of both answers, in tokens: what the model prices."""

    normal_tokens: int  # the normal answer
    skeleton_tokens: int
    branch_tokens: tuple[int, ...]  # one per point
    max_running: int  # branches decoding at once (SoTConfig.max_running)
    prompt_tokens: int = 0  # the normal answer's prompt
    skeleton_prompt_tokens: int = 0
    branch_prompt_tokens: int = 0  # the branches' shared prompt (question and skeleton), prefilled once

    def __post_init__(self) -> None:
        counts = {"normal_tokens": self.normal_tokens, "skeleton_tokens": self.skeleton_tokens,
                  "prompt_tokens": self.prompt_tokens, "skeleton_prompt_tokens": self.skeleton_prompt_tokens,
                  "branch_prompt_tokens": self.branch_prompt_tokens}  # fmt: skip
        for name, value in counts.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}={value!r} must be a non-negative token count")
        if not self.branch_tokens or any(not isinstance(b, int) or b < 1 for b in self.branch_tokens):
            raise ValueError(f"branch_tokens={self.branch_tokens!r} must hold one positive token count per "
                             "point; an answer without points is no SoT answer, so do not price it")  # fmt: skip
        if not isinstance(self.max_running, int) or self.max_running < 1:
            raise ValueError(f"max_running={self.max_running!r} must be a positive number of branches")

    def info(self) -> dict:
        return {**asdict(self), "branch_tokens": list(self.branch_tokens)}


@dataclass(frozen=True, slots=True)
class LatencyDecision:
    """SoT or the normal answer by predicted time, with the numbers the choice was made on.

    The times are None where no curve was known (`use_sot` is then True: the router's choice
    stands)."""

    use_sot: bool
    reason: str
    margin: float
    running: int
    waiting: int
    shared: int  # other requests the answer's forwards were priced with (module doc)
    curve: str  # the curve's source, or "unknown"
    normal_ms: float | None = None
    sot_ms: float | None = None
    branches_at_once: int | None = None
    shape: AnswerShape | None = None
    costs: RowCosts | None = None  # the curve priced by, so each decision names its machine

    @property
    def ratio(self) -> float | None:
        """SoT's predicted time over the normal answer's (at most 1 - margin: SoT)."""
        return None if self.sot_ms is None else self.sot_ms / max(1e-9, self.normal_ms)

    def info(self) -> dict:
        out = {"use_sot": self.use_sot, "reason": self.reason, "margin": self.margin, "running": self.running,
               "waiting": self.waiting, "shared": self.shared, "curve": self.curve}  # fmt: skip
        if self.sot_ms is not None:
            out |= {"normal_ms": round(self.normal_ms, 1), "sot_ms": round(self.sot_ms, 1),
                    "ratio": round(self.ratio, 3), "branches_at_once": self.branches_at_once,
                    "shape": self.shape.info(), "row_costs": self.costs.info()}  # fmt: skip
        return out


def unpriced(load: ServerLoad, why: str, margin: float = MARGIN) -> LatencyDecision:
    """The decision where the answer cannot be priced (no curve known yet, or no load): the
    router's choice stands, and says why."""
    return LatencyDecision(True, f"not priced: {why}; the router's choice stands", margin,
                           load.running, load.waiting, load.shared, "unknown")  # fmt: skip


def decide(costs: RowCosts, load: ServerLoad, shape: AnswerShape, margin: float = MARGIN) -> LatencyDecision:
    """SoT where its predicted time is at most (1 - margin) of the normal answer's (module doc)."""
    if not _finite(margin) or not 0 <= margin < 1:
        raise ValueError(f"margin={margin!r} must lie in [0, 1): the share SoT must save to be chosen")
    answers, step = load.shared + 1, costs.step_ms
    prefill = lambda tokens: step(tokens) if tokens else 0.0  # noqa: E731
    normal_ms = answers * prefill(shape.prompt_tokens) + shape.normal_tokens * step(answers)
    points = len(shape.branch_tokens)
    free = points if load.free_slots is None else max(1, load.free_slots)
    at_once = min(points, shape.max_running, free)
    prompts = prefill(shape.skeleton_prompt_tokens) + prefill(shape.branch_prompt_tokens)
    prompts += prefill(points * BRANCH_SUFFIX_TOKENS)
    branches = branch_phase_ms(lambda n: step(answers * n), shape.branch_tokens, at_once)
    sot_ms = answers * prompts + shape.skeleton_tokens * step(answers) + branches
    decision = LatencyDecision(True, "", margin, load.running, load.waiting, load.shared, costs.source,
                               normal_ms, sot_ms, at_once, shape, costs)  # fmt: skip
    use_sot = decision.ratio <= 1 - margin
    return replace(decision, use_sot=use_sot, reason=_reason(decision, use_sot))


def branch_phase_ms(step: Callable[[int], float], lengths: tuple[int, ...], at_once: int) -> float:
    """The ms the branches take, at most `at_once` decoding together, longest first (as
    sot/planner.py starts them), a waiting one starting as one ends; `step(n)` prices a forward
    of n branches."""
    waiting = sorted(lengths, reverse=True)
    running, waiting = waiting[:at_once], waiting[at_once:]
    total = 0.0
    while running:
        steps = min(running)
        total += steps * step(len(running))
        running = [r - steps for r in running if r > steps]
        while len(running) < at_once and waiting:
            running.append(waiting.pop(0))
    return total


def _reason(d: LatencyDecision, use_sot: bool) -> str:
    verdict = "SoT" if use_sot else "a normal answer"
    batch = f"priced with {d.shared} other requests answered alike" if d.shared else "the server idle"
    return (f"{verdict}: SoT predicted {d.sot_ms / 1e3:.1f} s against {d.normal_ms / 1e3:.1f} s normally "
            f"(ratio {d.ratio:.2f}, SoT needs <= {1 - d.margin:.2f}; {d.branches_at_once} branches at once; "
            f"{batch}: {d.running} running, {d.waiting} waiting)")  # fmt: skip


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# -- expected lengths ---------------------------------------------------------------------------

# Until a server has seen answers of its own: five points, what most skeletons of the 1.5B
# have (the normal answer's prior length is sot.budget's).
PRIOR_POINTS = 5
PRIOR_SKELETON_TOKENS = 8 * PRIOR_POINTS  # "1. Keep a regular bedtime\n": about 8 tokens a point


@dataclass
class LengthBook:
    """Recent answer lengths on this server (the median of the last `window` of each), for the
    shape `decide` prices; the priors above until one is seen. Only answers to questions the
    router found suitable should be observed: other questions' answers are of other lengths."""

    window: int = 64
    _normal: deque = field(default_factory=deque, init=False, repr=False)
    _skeleton: deque = field(default_factory=deque, init=False, repr=False)
    _points: deque = field(default_factory=deque, init=False, repr=False)
    _branch: deque = field(default_factory=deque, init=False, repr=False)

    def observe_normal(self, completion_tokens: int) -> None:
        self._push(self._normal, completion_tokens)

    def normal(self) -> int | None:
        """The median normal answer's completion tokens seen here; None before the first."""
        return int(statistics.median_low(self._normal)) if self._normal else None

    def observe_sot(self, skeleton_tokens: int, branch_tokens: list[int]) -> None:
        self._push(self._skeleton, skeleton_tokens)
        self._push(self._points, len(branch_tokens))
        for tokens in branch_tokens:
            self._push(self._branch, tokens)

    def _push(self, values: deque, value: int) -> None:
        values.append(value)
        if len(values) > self.window:
            values.popleft()

    def shape(self, config: SoTConfig, cap: int | None, prompt_tokens: int = 0, skeleton_prompt_tokens: int = 0,
              branch_prompt_tokens: int = 0) -> AnswerShape:  # fmt: skip
        """The expected shape of an answer capped at `cap` completion tokens (None: uncapped):
        the normal answer within the cap; the skeleton within its budget; the points' branches
        within the budgets the runner would give them were the SoT answer to aim at the normal
        answer's expected length, each at most its recent median, else where a point ends: half
        a sentence past its aim. Not at SoT's own aim (`aim`, below the median), so that SoT is
        never chosen for writing less than the normal answer: speed counts at equal length.
        `branch_prompt_tokens` counts the branches' shared prompt without the skeleton's points,
        which the shape adds as the skeleton expected."""
        normal = expected_tokens(self.normal(), cap)
        skeleton = min(_median(self._skeleton, PRIOR_SKELETON_TOKENS), skeleton_budget(config, cap))
        points = self.points(config)
        aim = max(POINT_AIM_TOKENS, point_target(normal, skeleton, points))  # what the runner aims at, or more
        left = None if cap is None else max(0, cap - skeleton)
        branches = (Branch(i, str(i), branch_budget(aim, config), None) for i in range(points))
        plan = fit_plan(BranchPlan(tuple(branches), config.max_running), left, config)
        budgets = [b.max_new_tokens for b in plan.branches] if plan is not None else [config.min_branch_tokens]
        typical = _median(self._branch, aim + HALF_SENTENCE_TOKENS)  # a point ends past its aim
        return AnswerShape(
            normal, skeleton, tuple(min(b, typical) for b in budgets),
            config.max_running, prompt_tokens, skeleton_prompt_tokens,
            branch_prompt_tokens + skeleton if branch_prompt_tokens else 0,
        )  # fmt: skip

    def points(self, config: SoTConfig) -> int:
        """The points a skeleton is expected to have, within what `config` plans."""
        return max(config.min_points, min(_median(self._points, PRIOR_POINTS), config.branch_cap))

    def info(self) -> dict:
        return {"seen": {"normal": len(self._normal), "sot": len(self._skeleton)},
                "median_normal_tokens": expected_tokens(self.normal(), None),
                "median_skeleton_tokens": _median(self._skeleton, PRIOR_SKELETON_TOKENS),
                "median_points": _median(self._points, PRIOR_POINTS)}  # fmt: skip


def _median(values: deque, prior: int) -> int:
    return int(statistics.median_low(values)) if values else prior
