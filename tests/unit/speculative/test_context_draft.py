"""The SoT-context drafter: n-gram index, sibling context, tree shape and masks."""

from __future__ import annotations

import random

import pytest

from sglang_specsot.speculative.context_draft import (
    ContextDraftConfig,
    ContextDrafter,
    DraftTree,
    TokenIndex,
    pad_tree,
    tree_mask,
)


def test_token_index_matches_longest_keys_first_then_newest():
    index = TokenIndex(key_len=2)
    index.extend([1, 2, 3, 9, 1, 2, 4, 5, 7, 2])
    # Tail "1 2": the two "1 2" ends (newest first), then the other "2" end. The suffix's
    # own end (10) has no continuation yet and is not offered.
    assert index.matches([1, 2], min_len=1, max_len=8, limit=5) == [(6, 2), (2, 2)]
    assert index.matches([7, 2], min_len=1, max_len=8, limit=5) == [(6, 1), (2, 1)]
    assert index.matches([1, 2], min_len=1, max_len=8, limit=1) == [(6, 2)]
    assert index.matches([8], min_len=1, max_len=8, limit=5) == []
    assert index.matches([7, 2], min_len=2, max_len=8, limit=5) == []  # only 1-gram matches


def test_token_index_measures_matches_longer_than_its_keys():
    index = TokenIndex(key_len=2)
    index.extend([5, 6, 7, 8, 1, 0, 6, 7, 8, 2])
    # "5 6 7 8" matches 4 tokens at end 4, "0 6 7 8" only 3 at end 9 (the key is 2 long).
    assert index.matches([5, 6, 7, 8], min_len=1, max_len=8, limit=5) == [(9, 3), (4, 4)]
    assert index.matches([5, 6, 7, 8], min_len=1, max_len=3, limit=5) == [(9, 3), (4, 3)]


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


def test_finished_siblings_are_kept_within_a_token_budget_oldest_first():
    # Memory must not grow with the SoT answers served: finished members beyond the budget go.
    drafter = ContextDrafter(ContextDraftConfig(finished_sibling_tokens=10))
    for rid, group in (("s1", "g1"), ("s2", "g2"), ("s3", "g3")):
        drafter.start(rid, [1, 2, 3, 4], group=group)
        drafter.forget(rid)
    assert not drafter.has("s1")  # 12 tokens > 10: the oldest finished member went
    assert drafter.has("s2") and drafter.has("s3")
    assert "g1" not in drafter._groups and drafter._finished_tokens == 8
    drafter.start("b", [1, 2], group="g3")
    assert drafter.siblings("b") == ["s3"]  # what stays still serves its group


def test_a_restarted_member_is_live_again_and_joins_its_group_once():
    drafter = ContextDrafter(ContextDraftConfig(finished_sibling_tokens=4))
    drafter.start("b1", [1, 2, 3], group="g")
    drafter.forget("b1")  # e.g. retracted
    drafter.start("b1", [1, 2, 3, 4], group="g")  # back through prefill
    drafter.start("b2", [1, 2, 3, 4, 5, 6], group="g")
    drafter.forget("b2")  # over the budget alone: b2 goes, the live b1 stays
    assert drafter.has("b1") and not drafter.has("b2")
    assert drafter._groups["g"] == ["b1"] and drafter._finished_tokens == 0


def test_sizes_stay_within_their_bounds_however_many_requests_are_served():
    config = ContextDraftConfig(finished_sibling_tokens=40, corpus_tokens=64)
    drafter = ContextDrafter(config, max_groups=3)
    rng = random.Random(0)
    for i in range(200):
        group = f"g{i // 4}" if i % 2 else None  # half SoT branches, half plain requests
        drafter.start(f"r{i}", [rng.randrange(50) for _ in range(rng.randrange(1, 30))], group=group)
        drafter.forget(f"r{i}")
    sizes = drafter.sizes()
    assert sizes["requests"] <= sizes["finished_sibling_tokens"] <= config.finished_sibling_tokens
    assert 0 < sizes["groups"] <= 3
    # Two generations of at most half the budget each (one request may fill one alone).
    assert 0 < sizes["corpus_tokens"] <= config.corpus_tokens + 30


def test_match_length_is_the_longest_match_of_the_recent_tokens_anywhere_in_the_context():
    drafter = ContextDrafter()
    phrase = list(range(100, 120))
    drafter.start("a", [1, 2] + phrase + [3] + phrase[:15], group="g")  # repeating itself
    assert drafter.match_length("a") == 15
    drafter.start("b", [7, 8, 9], group="g")
    assert drafter.match_length("b") == 0  # its last tokens occur nowhere else
    drafter.start("c", [4] + phrase[:6], group="g")
    assert drafter.match_length("c") == 6  # a sibling's text


def test_forget_drops_ungrouped_requests():
    drafter = ContextDrafter()
    drafter.start("a", [1, 2])
    drafter.forget("a")
    assert not drafter.has("a")


@pytest.mark.parametrize("seed", range(20))
def test_random_trees_respect_budget_and_order(seed):
    rng = random.Random(seed)
    drafter = ContextDrafter(ContextDraftConfig(max_ngram=3, per_source=3))
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


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(min_ngram=0), dict(min_ngram=3, max_ngram=2), dict(max_ngram=257), dict(key_len=0),
        dict(per_source=0), dict(depth_decay=0.0), dict(depth_decay=1.5), dict(match_power=-1.0),
        dict(sibling_weight=-1.0), dict(corpus_weight=-0.5), dict(corpus_tokens=-1),
    ],
)  # fmt: skip
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


# -- scoring: which candidates win the node budget ------------------------------------------


def test_a_long_match_outvotes_a_frequent_short_one():
    drafter = ContextDrafter()
    # After "4": 20 four times (matching only "4"), 10 once (after "1 2 3 4", matching 4 tokens).
    drafter.start("a", [1, 2, 3, 4, 10, 0, 4, 20, 0, 4, 20, 0, 4, 20, 0, 4, 20, 0, 1, 2, 3, 4])
    assert drafter.propose("a", 2).tokens == (4, 10)


def test_agreement_outvotes_recency_at_equal_match_length():
    drafter = ContextDrafter()
    # After "5": 7 three times, 8 once and most recently; every match is one token long.
    drafter.start("a", [1, 5, 7, 2, 5, 7, 3, 5, 7, 4, 5, 8, 9, 5])
    assert drafter.propose("a", 2).tokens == (5, 7)
    # The runner-up at depth 1 beats every depth-2 node below 7 (each has a third of its votes).
    assert drafter.propose("a", 3).tokens == (5, 7, 8)


def test_a_strong_match_gets_the_whole_chain_before_weak_branches():
    drafter = ContextDrafter()
    drafter.start("a", [1, 2, 3, 4, 5, 6, 7, 8, 30, 4, 40, 31, 4, 41, 1, 2, 3, 4])
    tree = drafter.propose("a", 6)
    assert tree.leaf_paths() == [[5, 6, 7, 8, 30]]


# -- the corpus of finished requests ---------------------------------------------------------


def test_finished_requests_feed_other_requests_through_the_corpus():
    drafter = ContextDrafter()
    drafter.start("a", [1, 2, 3, 50, 51, 52, 53])
    drafter.start("b", [9, 2, 3, 50])
    assert drafter.propose("b", 4).tokens == (50,)  # "a" is running in no group of b's
    drafter.forget("a")  # finished: no longer a request, but its text stays in the corpus
    assert not drafter.has("a")
    assert drafter.propose("b", 4).tokens == (50, 51, 52, 53)
    off = ContextDrafter(ContextDraftConfig(corpus_tokens=0))
    off.start("a", [1, 2, 3, 50, 51, 52, 53])
    off.forget("a")
    off.start("b", [9, 2, 3, 50])
    assert off.propose("b", 4).tokens == (50,)


def test_corpus_matches_never_cross_a_request_boundary():
    drafter = ContextDrafter()
    for rid, tokens in (("a", [1, 2, 3]), ("c", [7, 8])):
        drafter.start(rid, tokens)
        drafter.forget(rid)
    drafter.start("b", [5, 3])
    assert drafter.propose("b", 4).tokens == (3,)  # "a" ended at 3; "7" is another request
    drafter.start("d", [5, 2])
    assert drafter.propose("d", 4).tokens == (2, 3)


def test_corpus_keeps_two_generations_within_its_token_budget():
    drafter = ContextDrafter(ContextDraftConfig(corpus_tokens=8))  # two generations of 4
    for rid, tokens in (("a", [1, 2]), ("b", [3, 4]), ("c", [5, 6])):
        drafter.start(rid, tokens)
        drafter.forget(rid)
    drafter.start("q1", [9, 1])
    drafter.start("q3", [9, 3])
    drafter.start("q5", [9, 5])
    assert drafter.propose("q1", 3).tokens == (1,)  # "a" was evicted with the oldest generation
    assert drafter.propose("q3", 3).tokens == (3, 4)
    assert drafter.propose("q5", 3).tokens == (5, 6)


def test_a_restart_does_not_put_the_partial_output_in_the_corpus():
    drafter = ContextDrafter()
    drafter.start("a", [1, 2, 3])
    drafter.start("a", [1, 2, 3, 4])  # e.g. retracted and prefilled again
    drafter.start("z", [8, 3])
    assert drafter.propose("z", 3).tokens == (3,)
    drafter.forget("a")
    assert drafter.propose("z", 3).tokens == (3, 4)


def test_own_group_members_in_the_corpus_vote_once_as_siblings():
    # b1 finishes: it stays a sibling of b2 and enters the corpus, where b2 must skip it.
    # Votes (match_power 1): b2's own "8 5 6" -> 70 weighs 3, b1's "5 6" -> 60 weighs 2, and
    # would weigh 4 if counted twice.
    drafter = ContextDrafter(ContextDraftConfig(corpus_weight=1.0, match_power=1.0))
    drafter.start("b1", [5, 6, 60], group="g")
    drafter.forget("b1")
    drafter.start("b2", [8, 5, 6, 70, 8, 5, 6], group="g")
    assert drafter.propose("b2", 2).tokens == (6, 70)


def test_accepted_is_the_longest_root_path_the_truth_follows():
    tree = DraftTree(tokens=(7, 1, 2, 3, 4), parents=(-1, 0, 0, 1, 3))  # 7 -> 1 -> 3 -> 4, 7 -> 2
    assert tree.accepted([1, 3, 4, 9]) == 3
    assert tree.accepted([1, 3]) == 2  # the truth ends first
    assert tree.accepted([2, 5]) == 1
    assert tree.accepted([3, 4]) == 0  # 3 is a grandchild, not a child of the root
    assert DraftTree((7,), (-1,)).accepted([1]) == 0
