"""Under tensor parallelism every rank plans the same steps: two ranks (torch.distributed gloo,
two processes) whose clocks disagree choose the same tree widths, because each takes rank 0's
times (`rank_agreement.TimingLedger`, the worker's `timings`).

The ranks run the worker's policy (`StepPolicy`, pricing a step by its verify rows as the SoT
context's costs do; the children import no SGLang, so they start in seconds) and hand it their
times as the worker does: outcomes through `timings.observe`, forward times through the cost
model's curves, `timings.agree()` at each step's start. Both measure plain steps at 100 ms;
rank 0 measures its 5-wide steps at 400 ms (drafting loses), rank 1 at 100 ms (it pays). Left to their own clocks (the control) they choose widths 1 and 5, and a
verify of one width on one rank and another on the other is a collective that never completes.
"""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace

import torch.distributed as dist
import torch.multiprocessing as mp

from sglang_specsot.costs.cost_model import CostModel, ForwardCost
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.planning import StepPlan
from sglang_specsot.speculative.policy.step_policy import StepPolicy
from sglang_specsot.speculative.policy.values import StepDecision, StepOutcome
from sglang_specsot.speculative.rank_agreement import SOLO, RankAgreement, TimingLedger
from sglang_specsot.speculative.requests import RequestBook

WORLD = 2
WINDOW, BS, WIDE = 8, 4, 5
STEPS = 5  # steps of each width timed (a shape's first is not counted)
CONFIG = AdaptiveConfig(buckets=((1, (0, 7)),), explore_share=0.0)


class VerifyRows:
    """The policy's DraftCosts for drafts that cost verify rows only (as the SoT context's)."""

    min_budget, learns_from_shadows, bounded_by_wider = 0, True, True

    def __init__(self, cost: CostModel):
        self.cost = cost

    def candidate_budgets(self, budgets: tuple[int, ...]) -> tuple[int, ...]:
        return budgets

    def modelled_ms(self, bs: int, width: int) -> float:
        return self.cost.step_ms(bs, width)


def _policy() -> tuple[StepPolicy, CostModel]:
    cost = CostModel(target=ForwardCost(probe_rows=(1, 64), probe_ms=(100.0, 100.0)))  # wide verifies "free"
    return StepPolicy(CONFIG, WINDOW, VerifyRows(cost)), cost


def _view():
    return RequestBook().view([SimpleNamespace(rid=f"r{i}") for i in range(BS)])


def _outcome(width: int, ms: float) -> StepOutcome:
    plan = StepPlan(width, (width - 1,) * BS, float(BS), ms)
    decision = StepDecision(_view(), plan, (), (), exploring=False, adaptive=True)
    return StepOutcome(decision, ms, BS, width, width > 1, False, timed=True, caught_up=False)


def _width(rank: int, agreement: RankAgreement) -> int:
    """The width a rank's policy chooses after timing plain and wide steps on its own clock."""
    policy, cost = _policy()
    timings = TimingLedger(agreement, cost, {policy.name: policy})
    wide_ms = 400.0 if rank == 0 else 100.0  # this rank's clock
    for width, ms in [(1, 100.0)] * STEPS + [(WIDE, wide_ms)] * STEPS:
        timings.agree()  # as forward_batch_generation begins
        cost.target.observe(BS * width, ms)
        timings.observe(policy.name, _outcome(width, ms))
    timings.agree()
    return max(policy.decide(_view(), cost_pricing()).sizes)


def cost_pricing():
    return SimpleNamespace(setup_ms=lambda: 0.0, first_acceptance=lambda firsts: firsts)


def _rank(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        own = _width(rank, SOLO)  # today's worker: each rank its own times
        agreed = _width(rank, RankAgreement(None, src=0, world_size=WORLD))
        gathered: list = [None] * WORLD
        dist.all_gather_object(gathered, {"own": own, "agreed": agreed})
        if rank == 0:
            with open(out, "w") as f:
                json.dump(gathered, f)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tp_agree_ranks_with_different_clocks_choose_the_same_widths(tmp_path):
    out = tmp_path / "widths.json"
    mp.spawn(_rank, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    rank0, rank1 = json.loads(out.read_text())
    # The control: on their own clocks the ranks part, one verifying 5 rows a request, one 1.
    assert (rank0["own"], rank1["own"]) == (1, WIDE), (rank0, rank1)
    # Agreed: both take rank 0's times, and its verdict (drafting loses).
    assert (rank0["agreed"], rank1["agreed"]) == (1, 1), (rank0, rank1)


def test_tp_agree_one_rank_applies_times_at_once_and_sends_nothing():
    policy, cost = _policy()
    ledger = TimingLedger(SOLO, cost, {policy.name: policy})
    curve = cost.target
    for _ in range(STEPS):  # a shape's first step is not counted
        ledger.observe(policy.name, _outcome(WIDE, 400.0))
    assert cost.target is curve and ledger.held == [] and policy.measured.ms(BS, WIDE) == 400.0
    assert ledger.agree() == 0
