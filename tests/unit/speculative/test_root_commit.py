"""A width-1 step's commit without SGLang's tree machinery is what that machinery commits.

`root_commit` claims two results of SGLang's own functions on width-1 trees: eagle_sample's
greedy walk returns each root's argmax, and move_accept_tokens_to_target_kvcache copies
every root's KV onto its own slot. Both are checked against SGLang's functions on CPU, and
every logits transform that must send a batch back to eagle_sample is checked to do so.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_specsot.host import adapter as sgl
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.root_commit import commits_argmax, root_argmax
from sglang_specsot.speculative.tree_masks import TreeMaskLayout
from sglang_specsot.speculative.verify_input import build_verify_input

VOCAB = 97


def sampling(**overrides) -> SimpleNamespace:
    fields = dict(is_all_greedy=True, logit_bias=None, acc_additive_penalties=None, acc_scaling_penalties=None,
                  has_watermark_candidates=False)  # fmt: skip
    return SimpleNamespace(**{**fields, **overrides})


def width_one_batch(bs: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(3, 40, (bs,), generator=gen)
    batch = SimpleNamespace(
        seq_lens=seq_lens, seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens, device="cpu",
        forward_mode=sgl.ForwardMode.TARGET_VERIFY, sampling_info=sampling(),
        out_cache_loc=torch.randperm(500, generator=gen)[:bs],
    )  # fmt: skip
    roots = [DraftTree(tokens=(int(t),), parents=(-1,)) for t in torch.randint(0, VOCAB, (bs,), generator=gen)]
    verify_input = build_verify_input(batch, roots, tuple("" for _ in roots), "cpu", TreeMaskLayout.QLEN_ONLY, 4096)
    logits = torch.randn(bs, VOCAB, generator=gen)
    return batch, verify_input, logits


@pytest.mark.parametrize("bs,seed", [(1, 0), (3, 1), (8, 2)])
def test_root_argmax_is_what_eagle_sample_commits(bs, seed, monkeypatch):
    # A unit test publishes no server config; eagle_sample reads one flag of it.
    spec = SimpleNamespace(speculative_use_rejection_sampling=False)
    monkeypatch.setattr("sglang.srt.speculative.eagle_utils.get_spec", lambda: spec)
    batch, verify_input, logits = width_one_batch(bs, seed)
    ours = root_argmax(logits.clone(), bs)
    theirs = sgl.eagle_sample(verify_input, batch, SimpleNamespace(next_token_logits=logits.clone()), None)
    for mine, sglang in zip(ours, theirs):
        assert mine.dtype == sglang.dtype and mine.shape == sglang.shape
        assert torch.equal(mine, sglang)


class RecordingCache:
    """The KV pool's move, recorded: (destination slots, source slots)."""

    def __init__(self):
        self.moves = []

    def move_kv_cache(self, tgt, src):
        self.moves.append((tgt.clone(), src.clone()))


@pytest.mark.parametrize("bs,seed", [(1, 3), (5, 4)])
def test_sglangs_kv_move_at_width_one_copies_every_root_onto_itself(bs, seed):
    batch, _, logits = width_one_batch(bs, seed)
    _, accept_lens, accept_index = root_argmax(logits, bs)
    cache = RecordingCache()
    allocator = SimpleNamespace(get_kvcache=lambda: cache)
    sgl.move_accept_tokens_to_target_kvcache(batch, accept_index, accept_lens - 1, allocator)
    (tgt, src), = cache.moves
    assert torch.equal(tgt, src) and torch.equal(tgt, batch.out_cache_loc.to(tgt.dtype))


@pytest.mark.parametrize(
    "overrides",
    [
        {"is_all_greedy": False},
        {"logit_bias": torch.zeros(1, VOCAB)},
        {"acc_additive_penalties": torch.zeros(1, VOCAB)},
        {"acc_scaling_penalties": torch.ones(1, VOCAB)},
    ],
)
def test_any_logits_transform_goes_through_eagle_sample(overrides):
    assert commits_argmax(sampling(), None, None)
    assert not commits_argmax(sampling(**overrides), None, None)


def test_grammar_watermark_and_simulated_acceptance_go_through_eagle_sample(monkeypatch):
    assert not commits_argmax(sampling(), object(), None)
    assert commits_argmax(sampling(), None, object())  # a watermark with no candidate in this batch
    assert not commits_argmax(sampling(has_watermark_candidates=True), None, object())
    monkeypatch.setattr(sgl, "simulated_accept_len", lambda: 3)
    assert not commits_argmax(sampling(), None, None)
