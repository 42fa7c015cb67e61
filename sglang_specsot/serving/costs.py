"""What server-side SoT prices an "auto" answer by, read in the HTTP process (sot/latency.py).

- The row-cost curve: the scheduler's, from its internal state (`specsot_row_costs`, host
  changes row-cost-probe and server-info-row-costs), fetched through
  `TokenizerManager.get_internal_state` once and then every REFRESH_S in the background. On a
  server that does not speculate, its rows-independent overhead is refreshed from the decode
  steps SGLang's scheduler times (`LoadSnapshot.decode_moments`); SPECSOT's curve carries the
  overhead its worker learns from its own steps.
- The load: the running batch, queue and `max_running_requests` of SGLang's load snapshot
  (`TokenizerManager.get_loads`, the shared memory /v1/loads reads), at each decision.
- The lengths: a `LengthBook` of this server's recent answers to questions the router found
  suitable.

No request waits for the scheduler longer than FIRST_FETCH_S; until the curve is known, the
decision says so and the router's choice stands.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from sglang_specsot.costs.published import REPORT_KEY
from sglang_specsot.sot.latency import LengthBook, RowCosts, ServerLoad

logger = logging.getLogger(__name__)

REFRESH_S = 60.0  # how old a fetched curve may grow before it is fetched again
RETRY_S = 5.0  # while no curve is known, how often to ask
FIRST_FETCH_S = 5.0  # how long the first decision waits for the first answer
MIN_WINDOW_STEPS = 32  # decode steps a refreshed overhead is the mean of


@dataclass
class StepWindow:
    """SGLang's timed decode steps (`decode_moments`: cumulative count, sum of batch sizes, sum
    of step microseconds, ...), taken in windows of at least `min_steps`: the mean batch size and
    step ms of the last full window, or None before one."""

    min_steps: int = MIN_WINDOW_STEPS
    mean: tuple[float, float] | None = None  # (batch size, ms)
    _start: tuple[float, ...] | None = field(default=None, repr=False)

    def update(self, totals: list[float] | None) -> None:
        if not totals or len(totals) < 3:
            return
        start = self._start
        if start is None or totals[0] < start[0]:  # the first reading, or the scheduler restarted
            self._start = tuple(totals)
            return
        steps = totals[0] - start[0]
        if steps >= self.min_steps:
            self.mean = ((totals[1] - start[1]) / steps, (totals[2] - start[2]) / steps / 1e3)
            self._start = tuple(totals)

    def overhead_ms(self, probe: RowCosts) -> float | None:
        """What the window's steps took beyond the probe's rows-dependent part (never below 0)."""
        if self.mean is None:
            return None
        rows, ms = self.mean
        return max(0.0, ms - (probe.step_ms(max(1, round(rows))) - probe.overhead_ms))


class ServerCosts:
    """The curve, the load and the lengths, for one HTTP process's TokenizerManager."""

    def __init__(self, tokenizer_manager) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.book = LengthBook()
        self.steps = StepWindow()
        self._report: dict | None = None  # the scheduler's specsot_row_costs
        self._why = "the scheduler has not been asked yet"
        self._fetched_at: float | None = None
        self._fetching: asyncio.Task | None = None
        self._waited = False  # the first decision waited for the first answer
        speculating = getattr(tokenizer_manager.server_args, "speculative_algorithm", None)
        self._steps_refresh = speculating is None  # a speculative step is no decode step of that many rows

    async def curve(self) -> tuple[RowCosts | None, str]:
        """The curve to price by, or None and why not."""
        now = time.monotonic()
        stale = self._fetched_at is None or now - self._fetched_at > (REFRESH_S if self._report else RETRY_S)
        if stale and (self._fetching is None or self._fetching.done()):
            self._fetching = asyncio.ensure_future(self._fetch())
        if self._fetched_at is None and not self._waited:
            self._waited = True  # one request waits; the others go on while the scheduler is slow
            try:  # shielded: a slow answer still lands for later requests
                await asyncio.wait_for(asyncio.shield(self._fetching), FIRST_FETCH_S)
            except asyncio.TimeoutError:
                pass
        if self._fetched_at is None:
            return None, "the scheduler has not answered yet"
        return self._costs(), self._why

    async def load(self) -> tuple[ServerLoad | None, str]:
        """The scheduler's running batch and queue now (the first DP rank's), or None and why not."""
        try:
            snapshots = await self.tokenizer_manager.get_loads()
        except Exception as exc:  # noqa: BLE001 - no snapshot to read (a multi-tokenizer server): unpriced
            return None, f"no load snapshot ({type(exc).__name__}: {exc})"
        if not snapshots:
            return None, "the scheduler has published no load snapshot yet"
        snap = snapshots[0]
        if self._steps_refresh:
            self.steps.update(getattr(snap, "decode_moments", None))
        cap = getattr(snap, "max_running_requests", 0) or None
        return ServerLoad(int(snap.num_running_reqs), int(snap.num_waiting_reqs), cap), ""

    async def _fetch(self) -> None:
        try:
            states = await self.tokenizer_manager.get_internal_state()
        except Exception as exc:  # noqa: BLE001 - any failure leaves the curve unknown, and says why
            self._why = f"asking the scheduler failed: {type(exc).__name__}: {exc}"
            self._fetched_at = time.monotonic()
            return
        state = states[0] if states else {}
        report = state.get(REPORT_KEY)
        if REPORT_KEY not in state:
            self._why = "the scheduler reports no curve (is sglang-specsot's plugin loaded in it?)"
        elif report is None:
            self._why = "the scheduler's start-up probe could not time this model"
        else:
            self._why = ""
        self._report = report or None
        self._fetched_at = time.monotonic()

    def _costs(self) -> RowCosts | None:
        report = self._report
        if report is None:
            return None
        try:
            probe = RowCosts(tuple(report["probe_rows"]), tuple(float(m) for m in report["probe_ms"]),
                             float(report.get("overhead_ms") or 0.0), source=_source(report))  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            self._why = f"the scheduler's curve is malformed ({exc})"
            return None
        overhead = self.steps.overhead_ms(probe) if self._steps_refresh else None
        if overhead is None:
            return probe
        return RowCosts(probe.rows, probe.ms, overhead, source=f"{probe.source}, overhead from decode steps")

    def info(self) -> dict:
        return {"curve": self._report, "why_not": self._why or None, "steps": self.steps.mean,
                "lengths": self.book.info()}  # fmt: skip


def _source(report: dict) -> str:
    steps = report.get("observed_steps") or 0
    return f"start-up probe, overhead from {steps} SPECSOT steps" if steps else "start-up probe"


_costs: ServerCosts | None = None


def server_costs(tokenizer_manager) -> ServerCosts:
    """The HTTP process's one ServerCosts, made on first use."""
    global _costs
    if _costs is None or _costs.tokenizer_manager is not tokenizer_manager:
        _costs = ServerCosts(tokenizer_manager)
    return _costs
