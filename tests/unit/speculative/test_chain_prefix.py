"""An adaptive step verifies only the first drafts of the draft model's chain, and DraftTree.height."""

from __future__ import annotations

import pytest

from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.drafters.model import chain_prefix

CHAIN = DraftTree(tokens=(7, 1, 2, 3), parents=(-1, 0, 1, 2))


def test_chain_prefix_keeps_the_first_drafts():
    assert chain_prefix(CHAIN, 2) == DraftTree((7, 1, 2), (-1, 0, 1))
    assert chain_prefix(CHAIN, 9) == CHAIN
    assert chain_prefix(CHAIN, 0) is None and chain_prefix(None, 3) is None


def test_height_is_the_longest_path():
    assert CHAIN.height == 3
    assert DraftTree((7,), (-1,)).height == 0
    assert DraftTree((7, 1, 2, 3), (-1, 0, 0, 1)).height == 2


def test_runner_ups_hang_beside_the_chain_as_leaves_in_bfs_order():
    from sglang_specsot.speculative.draft_tree import with_runner_ups

    # Depth 1's runner-up is the root's second child, depth 3's the second child of draft 2.
    tree = with_runner_ups(CHAIN, {1: 41, 3: 43})
    assert tree == DraftTree((7, 1, 41, 2, 3, 43), (-1, 0, 0, 1, 3, 3))
    assert tree.height == CHAIN.height and sorted(tree.leaf_paths()) == [[1, 2, 3], [1, 2, 43], [41]]
    # A runner-up equal to the chain's token there is left out (siblings carry distinct tokens).
    assert with_runner_ups(CHAIN, {2: 2}) == CHAIN
    with pytest.raises(AssertionError, match="outside the chain"):
        with_runner_ups(CHAIN, {4: 9})
