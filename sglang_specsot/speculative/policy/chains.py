"""Where a draft model's chain stops by its confidence, and which runner-ups join the verify.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sglang_specsot.speculative.policy.acceptance import FirstDraftCalibration


class ChainStop:
    """How deep a draft model's chain goes, decided between its forwards from its confidence.

    The plan sizes a chain before any draft forward runs, from each request's running
    acceptance `p` and the calibrated confidence of its first draft (the top-1 probability
    the last draft-extend left). Each further forward gives the draft's probability of the
    token it drafts, so a chain can stop where the draft turns unsure and go on where it
    stays sure. Between forwards, `go_on` weighs one more draft token for the batch: the
    expected committed tokens of the step so far against its cost (`step_ms(depth)`: the
    batch's step with `depth` drafts per request, as the plan prices it), and goes on while
    stopping deeper, at any depth up to `max_depth` (tokens not yet drafted accepted with `p`
    each given their parent was), raises tokens per ms. A drafted token's chance to be
    accepted given its parent was is the calibration's rate at the draft's probability of it
    (`FirstDraftCalibration`, which `observe`s every depth).

    Deeper, not only one deeper: a step's cost is not linear in its depth. A step's first
    draft forward carries the chain's setup, so the second draft costs more than the third;
    weighing the next token alone would stop a chain at depth 1 where depth 3 brings the
    most tokens per ms.

    Requests whose plan drafts nothing (`ps` entry with budget 0) do not count. Plain Python.
    """

    def __init__(
        self,
        ps: Sequence[float],
        first_q: Sequence[float | None],
        calibration: FirstDraftCalibration,
        step_ms: Callable[[int], float],
        min_token_prob: float,
        first_ps: Sequence[float] | None = None,
        max_depth: int | None = None,
    ) -> None:
        assert len(ps) == len(first_q), f"{len(first_q)} first drafts for {len(ps)} requests"
        assert max_depth is None or max_depth >= 1, f"max_depth {max_depth}"
        first_ps = list(ps) if first_ps is None else list(first_ps)
        assert len(first_ps) == len(ps), f"{len(first_ps)} first-draft estimates for {len(ps)} requests"
        self.ps, self.calibration, self.step_ms = list(ps), calibration, step_ms
        self.min_token_prob = min_token_prob
        self.qs: list[list[float]] = [[] if q is None else [q] for q in first_q]  # per request, by depth
        # Per request, by depth: the chance every draft up to that depth is accepted (the
        # first calibrated towards the first draft's estimate, the later ones towards `ps`).
        self.reach: list[list[float]] = [
            [] if q is None else [calibration.rate(q, f)] for q, f in zip(first_q, first_ps)
        ]
        self.tokens = len(ps) + sum(r[-1] for r in self.reach if r)  # expected committed tokens so far
        self.depth = 1
        self.max_depth = max_depth  # None: weigh one token more only

    def go_on(self) -> bool:
        """Whether stopping deeper (a token more per request, or up to `max_depth`) raises the
        step's expected tokens per ms over stopping now."""
        deepest = self.depth + 1 if self.max_depth is None else self.max_depth
        now = self.tokens / self.step_ms(self.depth)
        tokens, reach = self.tokens, [r[-1] for r in self.reach if r]
        ps = [p for r, p in zip(self.reach, self.ps) if r]
        for depth in range(self.depth + 1, deepest + 1):
            reach = [x * p for x, p in zip(reach, ps)]
            tokens += sum(reach)
            if tokens / self.step_ms(depth) > now:
                return True
        return False

    def observe(self, qs: Sequence[float]) -> None:
        """The draft's probability of the tokens it drafted at the next depth, per request."""
        assert len(qs) == len(self.reach), f"{len(qs)} probabilities for {len(self.reach)} requests"
        self.depth += 1
        for q_by_depth, reach, q, p in zip(self.qs, self.reach, qs, self.ps):
            if reach:  # a request that drafts
                q_by_depth.append(q)
                reach.append(reach[-1] * self.calibration.rate(q, p))
                self.tokens += reach[-1]

    def depths(self) -> list[int]:
        """Draft tokens each request keeps: its chain up to the last token still accepted with
        at least `min_token_prob` (at least its first; 0 for requests that draft nothing)."""
        out = []
        for reach in self.reach:
            kept = sum(1 for x in reach if x >= self.min_token_prob)  # reach only falls with depth
            out.append(min(len(reach), max(1, kept)))
        return out


def runner_up_gains(reach: Sequence[float], runner_up_ps: Sequence[float]) -> list[float]:
    """Expected tokens each depth's runner-up adds to a chain (index d - 1 for depth d).

    A runner-up (the draft's second choice where its first is the chain's token) is verified
    only where every draft above it was accepted (`reach[d - 2]`, 1 at depth 1), and is the
    target's token about as often as the draft's probability of it (docs/benchmarks.md).
    Each hit is one committed token more (the runner-up, then the bonus token after it where
    the chain's miss left only a bonus).
    """
    above = [1.0, *reach]
    return [above[d] * q for d, q in enumerate(runner_up_ps)]


def pick_runner_ups(
    gains: Sequence[Sequence[float]],
    sizes: Sequence[int],
    max_width: int,
    verify_ms: Callable[[int], float],
    step_ms: float,
    tokens: float,
    min_gain: float = 0.0,
) -> list[list[int]]:
    """Which runner-ups join the verify window: per request, the depths (1-based) chosen.

    The window is as wide as the widest request's tree and every request is verified at that
    width, so widths are weighed, not nodes: at width w each request adds its best
    `w - size` runner-ups (`gains[i]`, by depth), and the step's rate is its expected tokens
    (`tokens` plus the runner-ups') over its time (`step_ms` plus what a verify `w` wide costs
    more than one of the chains' width, `verify_ms(w)`). The width with the best rate wins;
    ties go to the narrower. Where the cost model says a wider verify costs nothing (a
    batch's rows under what a matrix product costs the same for), every runner-up that fits
    is verified: rows that are free. A runner-up worth less than `min_gain` never is (the
    worker passes `min_token_prob`, where a chain stops too): a row is not quite free."""
    assert len(gains) == len(sizes), f"{len(gains)} gain lists for {len(sizes)} requests"
    base = max(sizes, default=1)
    order = [sorted((d for d in range(len(g)) if g[d] >= min_gain and g[d] > 0), key=lambda d, g=g: -g[d]) for g in gains]
    best_rate, best_width = tokens / step_ms, base
    base_ms = verify_ms(base)
    for width in range(base + 1, max_width + 1):
        gain = sum(sum(g[d] for d in o[: max(0, width - s)]) for g, o, s in zip(gains, order, sizes))
        rate = (tokens + gain) / (step_ms + max(0.0, verify_ms(width) - base_ms))
        if rate > best_rate * (1.0 + 1e-9):
            best_rate, best_width = rate, width
    return [sorted(d + 1 for d in o[: max(0, best_width - s)]) for o, s in zip(order, sizes)]
