"""What a forward costs on this machine, measured: the target's time by rows, the draft's per step.

A forward's time is modelled as `overhead + linear(rows)`: `linear` is the time of the
model's matrix products for that many rows, probed at a few row counts at start-up and
interpolated between them; `overhead` (attention, kernel launches, per-layer Python, sampling)
does not grow with rows and is learned from the timings of real steps (the lower median of
what the probe leaves unexplained in the last `window` forwards). `linear` is nearly flat over
small row counts (on a CPU in bf16 as on a GPU, where it stays flat much further), so a wider
verify window costs little. The draft model is modelled the same way.

A probe slower than the real forwards it times a part of was disturbed (CPU time shared with
another process, such as a second server starting beside this one): then the curve is scaled
down to what those forwards took, and no overhead is added.

Plain Python (no torch, no SGLang): the worker measures, this module only keeps and answers.
"""

from __future__ import annotations

import bisect
import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field


PRIOR_FORWARDS = 2  # forwards a prior overhead counts as, until a model's window is full


@dataclass
class ForwardCost:
    """One model's forward time in ms as a function of rows (tokens in the forward)."""

    probe_rows: tuple[int, ...]  # increasing row counts the probe ran at
    probe_ms: tuple[float, ...]  # the probe's time at each (matrix products only)
    overhead_ms: float = 0.0  # rows-independent part, learned from real steps
    # Recent forwards the overhead is the lower median of. A median, not a mean: on a CPU the
    # first forward of a new shape can take many times the usual time (oneDNN builds its
    # kernels), and one such forward folded into an average would make the draft model look
    # several times as expensive for tens of steps, so the budget policy would stop drafting.
    window: int = 32
    # Until this model has run forwards of its own, its overhead is `prior.overhead_ms *
    # prior_share` (the draft's is the target's, scaled by their layer counts). An overhead
    # of 0 would make a never-run draft model look far cheaper than it is (its overhead is of
    # the target's order), and the policy would draft at a loss.
    prior: ForwardCost | None = None
    prior_share: float = 1.0
    observed: int = field(default=0, init=False)  # real steps folded in so far
    # What the probe's curve is multiplied by: 1, or below 1 where most recent forwards took
    # less than the probe's matrix products alone (see `observe`).
    scale: float = field(default=1.0, init=False)
    # Recent forwards as (ms, the probe's curve at their rows): their residuals and ratios.
    _forwards: deque = field(default_factory=deque, init=False, repr=False)

    def __post_init__(self) -> None:
        assert len(self.probe_rows) == len(self.probe_ms) >= 1, "one time per probe size"
        assert list(self.probe_rows) == sorted(set(self.probe_rows)) and self.probe_rows[0] >= 1, (
            f"probe rows must be increasing positive ints, got {self.probe_rows}"
        )
        assert self.window >= 1, f"window {self.window} must be >= 1"

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
        return self.current_overhead_ms() + self.scale * self.linear_ms(rows)

    def cheapest_rows(self) -> int | None:
        """The probed row count at which a forward costs least per row, or None where that is
        the largest one probed: beyond it the curve grows by its last slope, and a forward
        of more rows costs ever less per row. Below the largest probe, rows cost more past
        this count (on a CPU, kernels chosen by row count: the draft's int8 products stop at
        16 rows, and bf16 without native support costs about linearly), so work that may be
        split, as a catch-up may, is cheapest in forwards of this many rows."""
        per_row = [self.ms(rows) / rows for rows in self.probe_rows]
        best = min(range(len(per_row)), key=per_row.__getitem__)
        return None if best == len(per_row) - 1 else self.probe_rows[best]

    def current_overhead_ms(self) -> float:
        """The learned overhead; with a prior, its scaled overhead while nothing has been
        learned, and counted as `PRIOR_FORWARDS` of the median's forwards until the window
        is full: one slow early forward then cannot set the overhead alone. (Alone it could
        price drafting above any plan's gain, exploring's too, and the draft would never run
        again to correct it.)"""
        if self.prior is None or self.scale < 1.0:
            return self.overhead_ms
        prior = self.prior.overhead_ms * self.prior_share
        if self.observed == 0:
            return prior
        if len(self._forwards) < self.window:
            return statistics.median_low([*(max(0.0, ms - c) for ms, c in self._forwards), *[prior] * PRIOR_FORWARDS])
        return self.overhead_ms

    def observe(self, rows: int, ms: float) -> None:
        """Fold one real forward's time into the overhead (the first one sets it), or, where
        most of the recent forwards took less than the probe's products alone, into the scale.

        A real forward runs every product the probe timed and more (attention, norms), so it
        takes longer than the probe's curve unless the probe was disturbed; another process
        on the same cores only ever adds time. Left uncorrected, a disturbed probe overprices
        every width no step has measured, a plain step's among them: the policy would then
        draft where a plain step is cheaper, and never run one to learn otherwise."""
        self._forwards.append((ms, self.linear_ms(rows)))
        if len(self._forwards) > self.window:
            self._forwards.popleft()
        residual = statistics.median_low([ms - c for ms, c in self._forwards])
        if residual >= 0:
            self.overhead_ms, self.scale = residual, 1.0
        else:
            ratios = [ms / c if c > 0 else 1.0 for ms, c in self._forwards]
            self.overhead_ms, self.scale = 0.0, min(1.0, statistics.median_low(ratios))
        self.observed += 1

    def info(self) -> dict:
        """The curve priced by: `probe_ms` scaled where the probe was disturbed (its start-up
        times then under `probe_ms_at_start_up`), which the HTTP process prices SoT by."""
        scaled = self.scale < 1.0
        return {
            "probe_rows": list(self.probe_rows),
            "probe_ms": [round(x * self.scale, 3) for x in self.probe_ms],
            "overhead_ms": round(self.current_overhead_ms(), 3),
            "observed_steps": self.observed,
            **({"overhead_from_prior": True} if self.observed == 0 and self.prior is not None else {}),
            **({"probe_scale": round(self.scale, 4), "probe_ms_at_start_up": [round(x, 3) for x in self.probe_ms]}
               if scaled else {}),
        }  # fmt: skip


@dataclass
class CostModel:
    """The target's forward cost, and the draft model's when there is one."""

    target: ForwardCost
    draft: ForwardCost | None = None

    def step_ms(
        self, bs: int, width: int, draft_steps: int = 0, draft_extend: bool = True, extend_rows: float | None = None
    ) -> float:
        """One speculative step: `draft_steps` draft decodes of `bs` rows, a verify of
        `bs * width` rows, and (with a draft model, unless deferred) its draft-extend over
        `extend_rows` rows: by default the verify window, as SGLang extends; fewer where the
        extend covers only what the draft's own chain did not write (drafters/model.ModelDrafting)."""
        ms = self.target.ms(bs * width)
        if self.draft is not None:
            ms += draft_steps * self.draft.ms(bs)
            if draft_extend:
                ms += self.draft.ms(bs * width if extend_rows is None else extend_rows)
        return ms

    def info(self) -> dict:
        out = {"target": self.target.info()}
        if self.draft is not None:
            out["draft"] = self.draft.info()
        return out


class StepCostTable:
    """Real step times by (batch size, verify width), where they have been seen lately.

    The forward model above prices a step from its parts; a real step also pays what grows
    with rows outside the weight matrices (attention under the tree mask, the target's and
    the draft's logits and sampling over every row), which the model does not see, and which
    can be enough for the policy to pick windows slower than plain decoding. So the time of
    a (bs, width) seen at least `min_seen` times in the last `fresh_steps` steps is the
    lower median of its last `window` real steps; the model answers for the rest. A drafting
    width the model overprices is not tried and stays overpriced, which costs speed, never
    makes a step slower than plain; the plain step itself the policy measures before it
    weighs drafting against it (`StepPolicy.measures_plain`). With `skip_first`, the first
    step of each (bs, width) is not counted: it runs kernels built for its shapes then
    (oneDNN's on a CPU) at several times a step's usual time, and the few steps a plain step
    is measured by would otherwise price it at a cold step's time.
    """

    def __init__(
        self, window: int = 16, min_seen: int = 3, fresh_steps: int = 500, max_keys: int = 1024, skip_first: bool = False
    ):  # fmt: skip
        self.window, self.min_seen, self.fresh_steps, self.max_keys = window, min_seen, fresh_steps, max_keys
        self.skip_first = skip_first
        self._times: OrderedDict[tuple[int, int], deque] = OrderedDict()  # key -> (step, ms) of its times
        self._last: dict[tuple[int, int], int] = {}  # key -> step it was last seen at
        self._median: dict[tuple[int, int], float] = {}  # key -> median of its times, until it is next seen
        self.steps = 0

    def observe(self, bs: int, width: int, ms: float) -> None:
        """One real step (without a catch-up: that cost is owed whatever the step is)."""
        self.steps += 1
        key = (bs, width)
        first = key not in self._times
        times = self._times.setdefault(key, deque(maxlen=self.window))
        self._times.move_to_end(key)
        if not (first and self.skip_first):  # a shape's first step builds its kernels (see the class docstring)
            times.append((self.steps, ms))
            self._median.pop(key, None)
        self._last[key] = self.steps
        while len(self._times) > self.max_keys:
            old, _ = self._times.popitem(last=False)
            del self._last[old]
            self._median.pop(old, None)

    def seen_within(self, bs: int, width: int, steps: int) -> int:
        """How many of such a step's counted times were taken in the last `steps` steps."""
        return sum(1 for at, _ in self._times.get((bs, width), ()) if self.steps - at < steps)

    def ms(self, bs: int, width: int) -> float | None:
        """The measured time of such a step, or None where it is not known (well) enough."""
        times = self._times.get((bs, width))
        if times is None or len(times) < self.min_seen or self.steps - self._last[(bs, width)] > self.fresh_steps:
            return None
        # The policy asks for every candidate width each step: a key's median changes only when it is seen.
        if (bs, width) not in self._median:
            self._median[(bs, width)] = statistics.median_low([ms for _, ms in times])
        return self._median[(bs, width)]

    def wider_ms(self, bs: int, width: int) -> float | None:
        """The least measured time of a step of `bs` requests with a window wider than
        `width` (None where none is known): where a step's rows are all a wider window
        adds, a narrower step costs no more, and a narrower width measured dearer is noise
        (a width measured in a slow stretch, kept for `fresh_steps` because it is then not
        chosen again)."""
        wider = (self.ms(b, w) for b, w in self._times if b == bs and w > width)
        return min((ms for ms in wider if ms is not None), default=None)

    def narrower(self, bs: int, width: int) -> tuple[int, float] | None:
        """The widest window narrower than `width` measured for `bs` requests, and its time
        (None where none is known): what a step's unmodelled cost is read from."""
        narrower = ((w, self.ms(b, w)) for b, w in self._times if b == bs and w < width)
        return max(((w, ms) for w, ms in narrower if ms is not None), default=None)

    def info(self) -> dict:
        return {f"{bs}x{w}": round(self.ms(bs, w), 1) for bs, w in self._times if self.ms(bs, w) is not None}
