"""The SoT-context drafter: n-gram index, sibling context, tree shape and masks."""

from __future__ import annotations

import random

import pytest

from sglang_specsot.spec.context_draft import (
    ContextDraftConfig,
    ContextDrafter,
    DraftTree,
    TokenIndex,
    pad_tree,
    tree_mask,
)


def test_token_index_finds_newest_continuations_first():
    index = TokenIndex(max_ngram=3)
    index.extend([1, 2, 3, 9, 1, 2, 4, 5])
    assert index.continuations((1, 2), length=2, limit=5) == [[4, 5], [3, 9]]
    assert index.continuations((1, 2), length=2, limit=1) == [[4, 5]]
    assert index.continuations((7,), length=2, limit=5) == []
    # The suffix itself has no continuation yet and is not offered.
    assert index.continuations((4, 5), length=2, limit=5) == []


def test_own_repetition_is_drafted():
    drafter = ContextDrafter()
    drafter.start("a", [10, 11, 12, 13, 14, 10, 11])
    tree = drafter.propose("a", num_nodes=4)
    assert tree.tokens == (11, 12, 13, 14)  # root 11, then the chain seen after "10 11"
    assert tree.parents == (-1, 0, 1, 2)


def test_sibling_output_is_drafted_only_within_the_group():
    drafter = ContextDrafter()
    drafter.start("b1", [1, 2, 3, 50, 51, 52, 53, 54], group="g")
    drafter.start("b2", [1, 2, 3, 50], group="g")
    drafter.start("x", [1, 2, 3, 50], group="other")
    assert drafter.propose("b2", 5).tokens == (50, 51, 52, 53, 54)
    assert drafter.propose("x", 5).tokens == (50,)  # nothing to go on in its own group
    assert drafter.siblings("b2") == ["b1"]


def test_finished_group_members_stay_as_context_until_evicted():
    drafter = ContextDrafter(max_groups=1)
    drafter.start("b1", [5, 6, 7, 8], group="g")
    drafter.forget("b1")  # left the batch, but its text still helps its siblings
    drafter.start("b2", [5, 6], group="g")
    assert drafter.propose("b2", 3).tokens == (6, 7, 8)
    drafter.start("c", [5], group="h")  # evicts group g
    assert not drafter.has("b1") and not drafter.has("b2")


def test_forget_drops_ungrouped_requests():
    drafter = ContextDrafter()
    drafter.start("a", [1, 2])
    drafter.forget("a")
    assert not drafter.has("a")


@pytest.mark.parametrize("seed", range(20))
def test_random_trees_respect_budget_and_order(seed):
    rng = random.Random(seed)
    drafter = ContextDrafter(ContextDraftConfig(max_ngram=3, paths_per_source=3))
    for i in range(3):
        drafter.start(f"r{i}", [rng.randrange(6) for _ in range(rng.randrange(1, 60))], group="g")
    for n in (1, 2, 5, 8, 16):
        tree = drafter.propose("r0", n)
        assert 1 <= tree.size <= n
        assert tree.tokens[0] == drafter.tokens("r0")[-1]
        assert all(0 <= p < i for i, p in enumerate(tree.parents) if i)
        # BFS: depth never decreases along the node order.
        depths = [tree.depth(i) for i in range(tree.size)]
        assert depths == sorted(depths)
        # No two children of one node carry the same token (a trie).
        seen = {(p, t) for p, t in zip(tree.parents[1:], tree.tokens[1:])}
        assert len(seen) == tree.size - 1


def test_tree_mask_is_ancestor_or_self():
    tree = DraftTree(tokens=(7, 1, 2, 3, 4), parents=(-1, 0, 0, 1, 3))
    mask = tree_mask(tree, 6)
    expect = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 3, 4}, 5: {5}}
    for i, row in enumerate(mask):
        assert {j for j, v in enumerate(row) if v} == expect[i]


def test_pad_tree_hangs_a_chain_below_the_last_node():
    tree = pad_tree(DraftTree((7, 1, 2), (-1, 0, 0)), 5, filler=7)
    assert tree.tokens == (7, 1, 2, 7, 7) and tree.parents == (-1, 0, 0, 2, 3)
    assert pad_tree(DraftTree((7,), (-1,)), 3, filler=7).parents == (-1, 0, 1)
    with pytest.raises(AssertionError):
        pad_tree(tree, 3, filler=0)


@pytest.mark.parametrize("seed", range(20))
def test_padded_trees_keep_sibling_tokens_distinct(seed):
    # Tree sampling is lossless only if the children of a node carry distinct tokens.
    rng = random.Random(seed)
    drafter = ContextDrafter()
    drafter.start("r", [rng.randrange(3) for _ in range(40)])
    tree = pad_tree(drafter.propose("r", 6), 10, filler=drafter.tokens("r")[-1])
    children = {}
    for node in range(1, tree.size):
        children.setdefault(tree.parents[node], []).append(tree.tokens[node])
    assert all(len(set(c)) == len(c) for c in children.values()), children
    depths = [tree.depth(i) for i in range(tree.size)]
    assert depths == sorted(depths)


@pytest.mark.parametrize("kwargs", [dict(min_ngram=0), dict(min_ngram=3, max_ngram=2), dict(max_ngram=17), dict(paths_per_source=0)])
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match="got"):
        ContextDraftConfig(**kwargs)


def test_seed_tree_goes_in_whole_and_context_fills_the_rest():
    drafter = ContextDrafter()
    drafter.start("a", [5, 6, 7, 8, 5, 6])  # the context proposes 7, 8, 5, 6 after "5 6"
    # A draft model's chain from the root 6: 9, 9 (disagrees with the context at once).
    seed = DraftTree(tokens=(6, 9, 9), parents=(-1, 0, 1))
    tree = drafter.propose("a", 6, seed=seed)
    assert tree.size == 6
    paths = tree.leaf_paths()
    assert [9, 9] in paths  # the seed survives whole
    assert [7, 8, 5] in paths  # the context fills the remaining 3 nodes


def test_seed_and_context_share_agreeing_nodes():
    drafter = ContextDrafter()
    drafter.start("a", [5, 6, 7, 8, 5, 6])
    seed = DraftTree(tokens=(6, 7, 8), parents=(-1, 0, 1))
    tree = drafter.propose("a", 5, seed=seed)
    assert tree.leaf_paths() == [[7, 8, 5, 6]]


def test_seed_with_another_root_is_a_broken_invariant():
    drafter = ContextDrafter()
    drafter.start("a", [1, 2, 3])
    with pytest.raises(AssertionError, match="seed tree root"):
        drafter.propose("a", 4, seed=DraftTree(tokens=(9, 1), parents=(-1, 0)))
