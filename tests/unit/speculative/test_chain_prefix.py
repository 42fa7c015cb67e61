"""An adaptive step verifies only the first drafts of the draft model's chain, and DraftTree.height."""

from __future__ import annotations

from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.model_worker import _chain_prefix

CHAIN = DraftTree(tokens=(7, 1, 2, 3), parents=(-1, 0, 1, 2))


def test_chain_prefix_keeps_the_first_drafts():
    assert _chain_prefix(CHAIN, 2) == DraftTree((7, 1, 2), (-1, 0, 1))
    assert _chain_prefix(CHAIN, 9) == CHAIN
    assert _chain_prefix(CHAIN, 0) is None and _chain_prefix(None, 3) is None


def test_height_is_the_longest_path():
    assert CHAIN.height == 3
    assert DraftTree((7,), (-1,)).height == 0
    assert DraftTree((7, 1, 2, 3), (-1, 0, 0, 1)).height == 2
