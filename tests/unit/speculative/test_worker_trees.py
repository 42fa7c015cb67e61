"""Our host-side tree encoding agrees with SGLang's reconstruct_indices_from_tree_mask."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from sglang_specsot.host.adapter import reconstruct_indices_from_tree_mask_func
from sglang_specsot.speculative.draft_tree import DraftTree, tree_mask
from sglang_specsot.speculative.tree_masks import TreeMaskLayout
from sglang_specsot.speculative.verify_input import build_verify_input, host_links
from tests.unit.speculative.builders import random_tree


@pytest.mark.parametrize("seed", range(10))
def test_links_and_positions_match_sglang(seed):
    rng = random.Random(seed)
    n, bs = rng.choice([2, 4, 8]), rng.randrange(1, 5)
    trees = [random_tree(rng, n) for _ in range(bs)]
    mask = torch.tensor([tree_mask(t, n) for t in trees], dtype=torch.bool).flatten()
    seq_lens = torch.tensor([rng.randrange(1, 50) for _ in range(bs)])
    positions = torch.empty(bs * n, dtype=torch.int64)
    links = [torch.full((bs, n), -1, dtype=torch.int64) for _ in range(3)]
    reconstruct_indices_from_tree_mask_func(mask, seq_lens, positions, *links, bs, n)
    next_token, next_sibling = host_links(tuple(trees), n)
    assert torch.equal(links[1], next_token)
    assert torch.equal(links[2], next_sibling)
    want = [int(seq_lens[b]) + t.depth(i) for b, t in enumerate(trees) for i in range(n)]
    assert positions.tolist() == want
    assert links[0].tolist() == [[b * n + i for i in range(n)] for b in range(bs)]


@pytest.mark.parametrize("seed", range(10))
def test_draft_model_trees_round_trip_through_sglang_links(seed):
    # A draft model's tree arrives in SGLang's (first child, next sibling) layout; reading
    # it back must give the same tree, in BFS order, whatever the branching.
    from sglang_specsot.speculative.model_draft import trees_from_links

    rng = random.Random(seed)
    n, bs = rng.choice([2, 5, 8]), rng.randrange(1, 5)
    trees = [random_tree(rng, n) for _ in range(bs)]
    next_token, next_sibling = host_links(tuple(trees), n)
    tokens = torch.tensor([t.tokens for t in trees], dtype=torch.int64)
    assert trees_from_links(tokens, next_token, next_sibling) == trees


def test_first_chain_follows_each_nodes_first_child():
    tree = DraftTree((1, 2, 3, 4, 5, 6), (-1, 0, 0, 1, 1, 3))  # 2 -> (4 -> 6, 5); 3
    assert tree.first_chain() == [2, 4, 6]
    assert DraftTree((1,), (-1,)).first_chain() == []


@pytest.mark.parametrize("bs", [1, 3, 8])
def test_a_step_of_roots_alone_has_the_links_sglangs_kernel_computes(bs):
    # build_verify_input skips the kernel at width 1; what it fills in instead must be the kernel's.
    seq_lens = torch.tensor([7 + 5 * b for b in range(bs)])
    batch = SimpleNamespace(seq_lens=seq_lens, seq_lens_sum=int(seq_lens.sum()))
    roots = [DraftTree(tokens=(b,), parents=(-1,)) for b in range(bs)]
    got = build_verify_input(batch, roots, tuple("" for _ in roots), "cpu", TreeMaskLayout.QLEN_ONLY, 4096)
    positions = torch.empty(bs, dtype=torch.int64)
    links = [torch.full((bs, 1), -1, dtype=torch.int64) for _ in range(3)]
    reconstruct_indices_from_tree_mask_func(torch.ones(bs, dtype=torch.bool), seq_lens, positions, *links, bs, 1)
    assert torch.equal(got.positions, positions)
    for mine, kernel in zip((got.retrieve_index, got.retrieve_next_token, got.retrieve_next_sibling), links):
        assert mine.dtype == kernel.dtype and torch.equal(mine, kernel)
    assert got.positions.data_ptr() != seq_lens.data_ptr()
