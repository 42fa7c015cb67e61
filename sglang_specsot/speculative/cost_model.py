"""What a forward costs on this machine, measured: the target's time by rows, the draft's per step.

A forward's time is modelled as `overhead(rows) + linear(rows)`: `linear` is the time of the
model's matrix products for that many rows, probed at a few row counts at start-up and
interpolated between them; `overhead` is what the probe leaves unexplained in real steps
(attention, kernel launches, per-layer Python, sampling), learned as `a + b * rows` by a
decayed least-squares fit. The per-row part matters: on this CPU attention over the cached
context costs per row (a SoT branch batch of 4 rows spent ~115 ms beyond the probe, a single
row ~50 ms), so a verify window that the probe calls nearly free is not. On a CPU in bf16,
`linear` is nearly flat from 1 to ~32 rows; on a GPU it is flat much further. The draft
model is modelled the same way.

Plain Python (no torch, no SGLang): the worker measures, this module only keeps and answers.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass
class ForwardCost:
    """One model's forward time in ms as a function of rows (tokens in the forward)."""

    probe_rows: tuple[int, ...]  # increasing row counts the probe ran at
    probe_ms: tuple[float, ...]  # the probe's time at each (matrix products only)
    overhead_ms: float = 0.0  # rows-independent part, learned from real steps
    overhead_per_row_ms: float = 0.0  # and the part that grows with rows (attention), likewise
    alpha: float = 0.1  # weight of one real step in the decayed fit
    observed: int = field(default=0, init=False)  # real steps folded in so far
    # Decayed sums of 1, rows, rows^2, residual, rows * residual over the real steps.
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5, init=False, repr=False)

    def __post_init__(self) -> None:
        assert len(self.probe_rows) == len(self.probe_ms) >= 1, "one time per probe size"
        assert list(self.probe_rows) == sorted(set(self.probe_rows)) and self.probe_rows[0] >= 1, (
            f"probe rows must be increasing positive ints, got {self.probe_rows}"
        )
        assert 0.0 < self.alpha <= 1.0, f"alpha {self.alpha} outside (0, 1]"

    def linear_ms(self, rows: int) -> float:
        """The probe's curve at `rows`: piecewise linear, extended with the last slope."""
        xs, ys = self.probe_rows, self.probe_ms
        if len(xs) == 1:
            return ys[0] * max(1.0, rows / xs[0])
        i = min(max(bisect.bisect_left(xs, rows), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        if rows <= x0:
            return y0  # below the first probe: no cheaper than one row
        return max(y0, y0 + (y1 - y0) * (rows - x0) / (x1 - x0))

    def ms(self, rows: int) -> float:
        return self.overhead_ms + self.overhead_per_row_ms * rows + self.linear_ms(rows)

    def observe(self, rows: int, ms: float) -> None:
        """Fold one real forward's time into the overhead fit (the first one sets it)."""
        residual = max(0.0, ms - self.linear_ms(rows))
        keep = 0.0 if self.observed == 0 else 1.0 - self.alpha
        sums = self._sums
        for i, x in enumerate((1.0, rows, rows * rows, residual, rows * residual)):
            sums[i] = sums[i] * keep + x
        self.observed += 1
        self.overhead_ms, self.overhead_per_row_ms = _fit(sums, self.overhead_per_row_ms)

    def info(self) -> dict:
        return {
            "probe_rows": list(self.probe_rows),
            "probe_ms": [round(x, 3) for x in self.probe_ms],
            "overhead_ms": round(self.overhead_ms, 3),
            "overhead_per_row_ms": round(self.overhead_per_row_ms, 4),
            "observed_steps": self.observed,
        }


# Below this weighted variance of rows (rows^2) the recent steps are one row count, give or take.
MIN_ROWS_VARIANCE = 1.0


def _fit(sums: list[float], slope: float) -> tuple[float, float]:
    """Intercept and slope (both >= 0) of the decayed least-squares line through the residuals.
    While the recent steps barely vary in rows (a run of plain steps), the slope cannot be
    told apart and the last one is kept; the intercept then absorbs the rest."""
    n, sx, sxx, sy, sxy = sums
    spread = n * sxx - sx * sx  # n^2 times the weighted variance of rows
    if spread >= n * n * MIN_ROWS_VARIANCE:
        slope = max(0.0, (n * sxy - sx * sy) / spread)
    intercept = (sy - slope * sx) / n
    if intercept < 0.0:  # a line through the origin fits better than a negative start
        intercept, slope = 0.0, (sxy / sxx if sxx > 0 else slope)
    return intercept, max(0.0, slope)


@dataclass
class CostModel:
    """The target's forward cost, and the draft model's when there is one."""

    target: ForwardCost
    draft: ForwardCost | None = None

    def step_ms(self, bs: int, width: int, draft_steps: int = 0, draft_extend: bool = True) -> float:
        """One speculative step: `draft_steps` draft decodes of `bs` rows, a verify of
        `bs * width` rows, and (with a draft model, unless deferred) its draft-extend over
        the same window."""
        ms = self.target.ms(bs * width)
        if self.draft is not None:
            ms += draft_steps * self.draft.ms(bs)
            if draft_extend:
                ms += self.draft.ms(bs * width)
        return ms

    def info(self) -> dict:
        out = {"target": self.target.info()}
        if self.draft is not None:
            out["draft"] = self.draft.info()
        return out
