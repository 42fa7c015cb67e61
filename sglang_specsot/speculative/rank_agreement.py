"""One set of timings for every tensor-parallel rank, so that every rank plans the same steps.

Under TP each rank runs the same scheduler loop and the same SPECSOT step, and every forward
is a collective: the ranks must verify trees of the same width and shape, run the same draft
forwards and the same draft-extends, or an all-reduce mismatches and hangs. Token histories
and verify results are the same on every rank; what differs is time. Each rank probes its own
forwards at start-up and times its own steps (a CPU's wall clock, a GPU's events, read when
the device has passed them: not at the same step on every rank), and the budget policy and the
draft's cost model plan every step from those times.

So, as SGLang's own speculative workers broadcast rank 0's decisions (spec_tp_sync.py), every
time a rank measures is replaced by rank 0's: the start-up costs once (`agree`), and within a
step the observations are held (`TimingLedger`) and applied at the next step's start as rank
0 held them, one broadcast a step over the TP group's CPU (gloo) group. Every plan is a pure
function of the same state on every rank, so the decisions agree without each being sent. At
TP 1 nothing is held and nothing is sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class RankAgreement:
    """Rank `src`'s value for every rank of a torch.distributed group (None: the default)."""

    def __init__(self, group=None, src: int = 0, world_size: int = 1):
        self.group = group
        self.src = src  # the global rank whose values every rank takes (the TP group's first)
        self.world_size = world_size

    @classmethod
    def for_tp(cls) -> RankAgreement:
        """Over this scheduler's TP group (SOLO at TP 1)."""
        from sglang_specsot.host import adapter as sgl

        group, src, world_size = sgl.tp_cpu_group()
        return cls(group, src, world_size) if world_size > 1 else SOLO

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def agree(self, value: Any) -> Any:
        """`value` as rank `src` holds it (pickled over the group); `value` itself at TP 1."""
        if not self.active:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=self.src, group=self.group)
        return box[0]


SOLO = RankAgreement()  # TP 1


class HeldCost:
    """A forward's cost curve whose observations wait in the ledger; everything else is the
    curve's own (what it prices now is what every rank priced: the state before this step)."""

    def __init__(self, curve, ledger: TimingLedger, name: str):
        self.curve, self.ledger, self.name = curve, ledger, name

    def observe(self, rows: int, ms: float) -> None:
        self.ledger.hold(self.name, (rows, ms))

    def __getattr__(self, attr: str):
        return getattr(self.curve, attr)


class TimingLedger:
    """Every time the cost model and the planners learn, applied as rank 0 measured it.

    `observe(planner, outcome)` and the cost curves' `observe` are held within a step;
    `agree()`, which every rank calls at the start of every step (the ranks run their steps in
    lockstep), applies rank 0's held observations on every rank, in the order rank 0 held them.
    At TP 1 observations apply at once and `agree` does nothing.
    """

    def __init__(self, agreement: RankAgreement, cost, planners: dict):
        self.agreement, self.cost, self.planners = agreement, cost, planners
        self.held: list[tuple[str, Any]] = []
        self.sinks: dict[str, Callable] = {}
        if agreement.active:
            self._hold_cost("target")
            self._hold_cost("draft")

    def _hold_cost(self, name: str) -> None:
        curve = getattr(self.cost, name, None)
        if curve is None or isinstance(curve, HeldCost):
            return
        self.sinks[name] = lambda args: curve.observe(*args)
        setattr(self.cost, name, HeldCost(curve, self, name))

    def hold(self, sink: str, args) -> None:
        self.held.append((sink, args))

    def observe(self, planner: str, outcome) -> None:
        """A step's outcome for the planner that planned it: held until the next `agree`."""
        if not self.agreement.active:
            self.planners[planner].observe(outcome)
            return
        self.held.append((f"planner:{planner}", outcome))

    def agree(self) -> int:
        """Apply rank 0's held observations on this rank; how many were applied."""
        if not self.agreement.active:
            return 0
        held, self.held = self.agreement.agree(self.held), []
        for sink, args in held:
            if sink.startswith("planner:"):
                self.planners[sink.removeprefix("planner:")].observe(args)
            else:
                self.sinks[sink](args)
        return len(held)
