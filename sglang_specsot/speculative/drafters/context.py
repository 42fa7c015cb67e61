"""Drafting from the SoT context alone: the request's prompt and output, its siblings', and a
corpus of finished requests (`context_draft.ContextDrafter`). No draft model, no forward.

Its drafts cost verify rows only, so on plain steps it proposes shadow trees for free and
learns from them (`shadow.py`) instead of exploring; and a narrower step never costs more than
a wider one, so a wider step's measured time bounds a narrower one's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sglang_specsot.costs.cost_model import CostModel
from sglang_specsot.speculative.context_draft import ContextDrafter
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.drafters import Proposal
from sglang_specsot.speculative.host_sync import Committed
from sglang_specsot.speculative.inputs import SoTDraftInput
from sglang_specsot.speculative.policy.acceptance import FirstDraftCalibration
from sglang_specsot.speculative.policy.step_policy import StepPolicy
from sglang_specsot.speculative.policy.values import StepDecision, Verified
from sglang_specsot.speculative.requests import RequestBook
from sglang_specsot.speculative.shadow import ShadowDrafts


class ContextCosts:
    """A SoT-context step costs its verify rows: the cost model's step, nothing before it."""

    min_budget = 0  # context drafting may always fall back to a plain decode
    bounded_by_wider = True

    def __init__(self, cost: CostModel, adaptive: bool):
        self.cost = cost
        self.learns_from_shadows = adaptive  # shadows teach the adaptive policy's estimates

    def candidate_budgets(self, budgets: tuple[int, ...]) -> tuple[int, ...]:
        return budgets

    def modelled_ms(self, bs: int, width: int) -> float:
        return self.cost.step_ms(bs, width)


class CalibratedFirsts:
    """Pricing of the SoT context: no setup, and each request's running first-draft estimate
    read through what such estimates realised on the steps that drafted (`calibrate`).

    A step drafts where its estimate is high, and a running estimate is high partly by chance:
    the steps that draft see less acceptance than their estimates said (on an AVX2 CPU, 0.24
    realised against 0.54 estimated, docs/benchmarks.md). Learning the realised rate per
    estimate prices the next such step at what it will likely bring."""

    def __init__(self, calibration: FirstDraftCalibration):
        self.calibration = calibration

    def setup_ms(self) -> float:
        return 0.0  # always current: nothing to catch up before it drafts

    def first_acceptance(self, firsts: Sequence[float]) -> list[float]:
        return [self.calibration.rate(f, f) for f in firsts]


class ContextDrafting:
    """The SoT context's trees; also the context every other drafter fills its trees from."""

    # Its next draft reads the committed tokens first thing: read at the step's end.
    settles_late = False

    def __init__(self, requests: RequestBook, cost: CostModel, adaptive: bool):
        self.requests = requests
        self.context = ContextDrafter()
        self.shadows = ShadowDrafts()  # trees proposed on plain steps, walked for free
        self.costs = ContextCosts(cost, adaptive)
        self.calibration = FirstDraftCalibration()  # estimated first acceptance -> realised, on drafting steps
        self.calibrated = CalibratedFirsts(self.calibration)

    # -- the requests' histories ------------------------------------------------------------

    def start(self, req, extra_tokens: list[int]) -> None:
        """(Re)start `req`'s history: its committed tokens plus `extra_tokens`."""
        tag = self.requests.read_tag(req)
        history = list(req.origin_input_ids_unpadded) + list(req.output_ids) + extra_tokens
        self.context.start(req.rid, history, group=tag.group)
        self.shadows.forget(req.rid)  # its walks followed the old history

    def history(self, req) -> list[int]:
        """`req`'s committed tokens and its bonus token; a request never seen at prefill (the
        caches were cleared) restarts from its committed tokens, the last one the root."""
        if not self.context.has(req.rid):
            self.start(req, [])
        return self.context.tokens(req.rid)

    def tree(self, req, n: int, seed: DraftTree | None = None) -> DraftTree:
        self.history(req)
        return self.context.propose(req.rid, n, seed=seed)

    def after_prefill(self, batch, result) -> SoTDraftInput:
        return SoTDraftInput.from_bonus(result.next_token_ids)

    # -- the step --------------------------------------------------------------------------

    def pricing(self, batch) -> CalibratedFirsts:
        return self.calibrated

    def draft(self, batch, decision: StepDecision, policy: StepPolicy, settle: Callable[[], None] = lambda: None) -> Proposal:
        settle()  # the histories must hold the last step's committed tokens
        sizes = decision.sizes
        trees = tuple(self.tree(req, n) for req, n in zip(batch.reqs, sizes))
        if max(sizes) == 1 and self.costs.learns_from_shadows:
            self.propose_shadows(batch, 1 + max(policy.candidate_budgets(len(sizes))))
        return Proposal(trees, "context", decision)

    def propose_shadows(self, batch, nodes: int) -> None:
        """The tree each request would have verified at the widest candidate budget, walked
        later by the tokens the target commits."""
        if nodes <= 1:
            return
        for req in batch.reqs:
            self.shadows.add(req.rid, self.context.propose(req.rid, nodes))

    def accept(self, reqs, committed: Committed, proposal: Proposal) -> Verified:
        """The committed tokens into the histories; what verify accepted of each tree: every
        draft it committed, whatever path through the tree it took."""
        lens = committed.lens
        shadows = self.append(reqs, committed.rows, lens)
        self.calibrate(proposal, lens)
        return verified(proposal, [k - 1 for k in lens], shadows, sum(lens))

    def calibrate(self, proposal: Proposal, lens: list[int]) -> None:
        """Each drafted request's running first-draft estimate against whether verify took its
        first draft; exploring steps too (they draft whatever the estimate), plain ones not."""
        firsts = proposal.decision.firsts
        if not firsts:
            return  # a fixed window decides from no estimate
        for f, tree, k in zip(firsts, proposal.trees, lens):
            if tree.size > 1:
                self.calibration.observe(f, k > 1)

    def append(self, reqs, rows: list[list[int]], lens: list[int]) -> list[tuple[int, int, int]]:
        """Each request's committed tokens (the first `lens` of its row) into its history;
        returns (request, depth, accepted) of the shadow drafts they walked."""
        shadows = []
        for i, (req, row, k) in enumerate(zip(reqs, rows, lens)):
            if self.context.has(req.rid):
                self.context.append(req.rid, row[:k])
                shadows.extend((i, depth, accepted) for depth, accepted in self.shadows.advance(req.rid, row[:k]))
        return shadows

    def draft_extend(self, batch, result, proposal: Proposal, policy: StepPolicy) -> bool:
        return False  # nothing to extend: the history is the context

    @property
    def catch_ups(self) -> int:
        return 0

    def policies(self) -> dict:
        return {}  # the worker's policy plans every step

    def forget(self, rid: str) -> None:
        self.context.forget(rid)
        self.shadows.forget(rid)

    def clear(self) -> None:
        self.context = ContextDrafter(self.context.config)
        self.shadows.clear()

    def report(self) -> dict:
        return {"shadow_drafts": self.shadows.proposed, "context_first_calibration": self.calibration.info()}

    def step_log_fields(self, proposal: Proposal) -> dict:
        return {"first_draft_q": None, "draft_extend": None, "cost": {}}


def verified(proposal: Proposal, accepted: list[int], shadows: list, committed: int) -> Verified:
    """The policy's evidence from one verify: each tree's depth and the drafts it accepted."""
    depths = tuple(t.height for t in proposal.trees)
    return Verified(depths, tuple(min(a, d) for a, d in zip(accepted, depths)), proposal.source, tuple(shadows), committed)

