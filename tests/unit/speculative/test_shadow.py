"""Shadow drafts: a tree proposed on a plain step, walked by the tokens committed after it,
scores what verify would have accepted."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.shadow import ShadowDrafts
from tests.unit.speculative.builders import context_worker, cost, decide

# Root 5; children 6 and 9; 6 -> 7 -> 8: height 3.
TREE = DraftTree((5, 6, 9, 7, 8), (-1, 0, 0, 1, 3))


def test_a_walk_scores_the_longest_path_the_committed_tokens_follow():
    shadows = ShadowDrafts()
    shadows.add("r", TREE)
    assert shadows.advance("r", [6]) == [] and shadows.pending() == 1  # still inside the tree
    assert shadows.advance("r", [7, 4]) == [(3, 2)]  # 6, 7 accepted, 4 leaves the tree
    assert shadows.pending() == 0


def test_a_walk_ends_at_a_leaf_or_at_the_first_miss():
    shadows = ShadowDrafts()
    shadows.add("r", TREE)
    assert shadows.advance("r", [9]) == [(3, 1)]  # 9 is a leaf: verify stops there too
    shadows.add("r", TREE)
    assert shadows.advance("r", [1]) == [(3, 0)]
    shadows.add("r", TREE)
    assert shadows.advance("r", [6, 7, 8]) == [(3, 3)]


def test_walks_started_on_successive_steps_advance_together():
    shadows = ShadowDrafts()
    shadows.add("r", TREE)  # proposed at root 5
    assert shadows.advance("r", [6]) == []
    shadows.add("r", DraftTree((6, 7, 3), (-1, 0, 1)))  # proposed at root 6: 7 -> 3
    assert shadows.advance("r", [7]) == []
    assert sorted(shadows.advance("r", [3])) == [(2, 2), (3, 2)]


def test_trees_without_drafts_and_forgotten_requests_leave_nothing():
    shadows = ShadowDrafts(max_pending=2)
    shadows.add("r", DraftTree((5,), (-1,)))
    assert shadows.pending() == 0 and shadows.proposed == 0
    for _ in range(5):
        shadows.add("r", TREE)
    assert shadows.pending() == 2  # bounded per request
    shadows.forget("r")
    assert shadows.pending() == 0 and shadows.advance("r", [6]) == []


def test_plain_steps_learn_from_shadows_until_drafting_pays():
    # Rows cost 10 ms more each after a 100 ms plain step: at p = 0.8 two drafts pay.
    config = AdaptiveConfig(buckets=((1, (0, 2)),), prior_accepts=0.1, prior_misses=0.9)
    worker = context_worker(config, cost((1, 2), (100.0, 110.0)))
    text = [11, 12, 13, 14, 15, 16, 17, 18]
    worker.context.context.start("r", text + text[:2])  # it repeats its own text: the context knows what comes
    batch = SimpleNamespace(reqs=[SimpleNamespace(rid="r")])
    widths = []
    for token in text[2:] * 3:
        decision = decide(worker, batch)
        widths.append(max(decision.sizes))
        if max(decision.sizes) > 1:
            break
        proposal = worker.drafter.draft(batch, decision, worker.policy)  # a plain step: its shadows proposed
        result = SimpleNamespace(
            accept_lens=torch.tensor([1]), next_token_ids=torch.tensor([token]), speculative_num_draft_tokens=1,
        )
        worker.draft_extend(batch, result, proposal)
    # p starts at 0.1 (plain); every shadow is accepted whole, and after a few steps the
    # estimate says two drafts pay: the batch drafts without ever having explored.
    assert widths[-1] == 3 and len(widths) > 2 and worker.policy.explored == 0, widths
    report = worker.speculative_state_report()["specsot"]
    assert report["shadow_drafts"] >= len(widths) - 1
    assert report["acceptance_by_depth"]["shadow"]["p_by_depth"][0] == 1.0
