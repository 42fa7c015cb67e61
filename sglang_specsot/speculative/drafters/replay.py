"""The replay of an acceptance trace on the worker's side (SGLANG_SPECSOT_REPLAY, `replay.py`):
trees of the recorded shapes, and verify's result forced to the recorded paths.

SoT-context drafting takes the recorded trees themselves. A draft model or EAGLE head drafts
its own: the plan's budgets are the recorded trees' drafts (an exploring plan, so the draft's
confidence does not cut them), and the recorded accept length is forced along its tree's
leftmost path (the draft model's nodes go in first), as SGLANG_SIMULATE_ACC_LEN accepts real
draft tokens; its accept and draft-extend then run on what was accepted, at their real cost.
A fixed chain or tree (not adaptive: draft graphs, top-k > 1) is drafted whole, so its tree
may be wider than the recorded one; where it is shallower than the recorded path, the path is
cut to its depth.

Like SGLang's `SGLANG_SIMULATE_ACC_LEN` (eagle_utils.py:807-841, spec_utils.py:527-577), the
target's verify forward and tree sampling run as in a real step and their result is then
replaced: `accept_index` follows each request's recorded path, `accept_lens` is its length, and
`predict` along the path is the next path node's draft token (so the committed tokens are the
path's drafts, then the target's own token at its end as the bonus). Every later stage (the KV
move, draft-extend, the drafter's accept) runs on that result as on a real one. The indices are
built on the host from the trace and copied without a wait: the step reads nothing more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch

from sglang_specsot.speculative.drafters import Proposal
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.drafters.context import ContextDrafting
from sglang_specsot.speculative.drafters.model import ModelProposal
from sglang_specsot.speculative.host_sync import to_device
from sglang_specsot.speculative.policy.values import StepDecision
from sglang_specsot.speculative.replay import ENV, TraceReplay, replayed_tree
from sglang_specsot.speculative.trace import TraceStep

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayedProposal(Proposal):
    """A proposal of recorded shapes, with the node verify must accept in each."""

    nodes: tuple[int, ...] = ()  # per request, the recorded accepted node (of the padded tree)


@dataclass(frozen=True)
class ReplayedModelProposal(ModelProposal, ReplayedProposal):
    """A draft model's own proposal, with the node verify must accept in each of its trees."""


class ReplayDrafting:
    """A drafter replaying the trace: SoT-context drafting's trees take the trace's shapes once
    it has drafted (so the host's work of a real step is done); a draft model drafts its own
    trees within the recorded sizes. Everything else is its drafter's."""

    def __init__(self, drafter, replay: TraceReplay) -> None:
        self.drafter = drafter
        self.replay = replay

    def draft(self, batch, decision, policy, settle: Callable[[], None]) -> ReplayedProposal:
        steps = self.replay.next_steps([req.rid for req in batch.reqs])
        if not isinstance(self.drafter, ContextDrafting):
            proposal = self.drafter.draft(batch, recorded_plan(decision, steps), policy, settle)
            nodes = tuple(node_at_depth(tree, 0 if s is None else s.accepted) for s, tree in zip(steps, proposal.trees))
            return with_nodes(proposal, nodes)
        proposal = self.drafter.draft(batch, decision, policy, settle)
        trees = tuple(replayed_tree(step, tree.tokens[0]) for step, tree in zip(steps, proposal.trees))
        nodes = tuple(0 if step is None else step.node for step in steps)
        return ReplayedProposal(trees, proposal.source, proposal.decision, nodes=nodes)

    def forget(self, rid: str) -> None:
        self.replay.forget(rid)
        self.drafter.forget(rid)

    def clear(self) -> None:
        self.replay.claims.clear()
        self.drafter.clear()

    def __getattr__(self, name: str):
        return getattr(self.drafter, name)  # the rest of the Drafter protocol, unchanged


def recorded_plan(decision: StepDecision, steps: list[TraceStep | None]) -> StepDecision:
    """`decision` with each request's budget the recorded tree's drafts (0 past its steps), and
    exploring, so a chain is drafted to its budget rather than cut by the draft's confidence."""
    budgets = tuple(0 if s is None else len(s.parents) - 1 for s in steps)
    plan = replace(decision.plan, width=1 + max(budgets, default=0), budgets=budgets)
    return replace(decision, plan=plan, exploring=True)


def node_at_depth(tree: DraftTree, depth: int) -> int:
    """The first node of `tree` at `depth` (at its deepest where it is shallower): the end of
    its leftmost path, the draft model's own where it has one (its tree goes in first)."""
    depths = [tree.depth(node) for node in range(tree.size)]
    return depths.index(min(depth, tree.height))


def with_nodes(proposal, nodes: tuple[int, ...]) -> ReplayedProposal:
    """`proposal`, of whatever kind its drafter reads back in accept and draft-extend, carrying `nodes`."""
    kind = ReplayedModelProposal if isinstance(proposal, ModelProposal) else ReplayedProposal
    return kind(**{f.name: getattr(proposal, f.name) for f in fields(proposal)}, nodes=nodes)


def replaying(drafter, window: int):
    """`drafter`, replaying the trace SGLANG_SPECSOT_REPLAY names if it is set."""
    replay = TraceReplay.from_env(window)
    if replay is None:
        return drafter
    logger.warning("SPECSOT replays %d recorded requests from %s: outputs are not the model's", len(replay.trace), ENV)
    return ReplayDrafting(drafter, replay)


def forced_acceptance(proposal: ReplayedProposal, verify_input, predict: torch.Tensor):
    """(predict, accept_lens, accept_index) of tree sampling, with each request's recorded path
    accepted instead of what the target chose.

    shapes: predict (bs * n,) int32, changed in place along the paths; accept_lens (bs,) int32;
    accept_index (bs, n) int32, flat node rows, -1 past the path."""
    n, trees = verify_input.draft_token_num, verify_input.host_trees  # trees padded to n
    index = torch.full((len(trees), n), -1, dtype=torch.int32)
    lens, along, after = [], [], []
    for b, (tree, node) in enumerate(zip(trees, proposal.nodes)):
        # A node past this step's padding (the batch is narrower than the recorded one) is a
        # filler of the recorded chain: its ancestor at the last row is on the same path.
        path = [b * n + i for i in tree.ancestors_or_self(min(node, n - 1))]
        index[b, : len(path)] = torch.tensor(path, dtype=torch.int32)
        lens.append(len(path))
        along, after = along + path[:-1], after + path[1:]
    device = predict.device
    if along:
        tokens = verify_input.draft_token[to_device(torch.tensor(after), device)]
        predict[to_device(torch.tensor(along), device)] = tokens.to(predict.dtype)
    return predict, to_device(torch.tensor(lens, dtype=torch.int32), device), to_device(index, device)
