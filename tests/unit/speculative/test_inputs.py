"""SoT input types: filter/merge with overlap on (future_indices) and off (tensors)."""

from __future__ import annotations

import torch

from sglang_specsot.speculative.inputs import SoTDraftInput, SoTVerifyInput


def test_sync_filter_and_merge_slice_real_tensors():
    a = SoTDraftInput.from_bonus(torch.tensor([5, 6, 7], dtype=torch.int32))
    a.filter_batch(torch.tensor([0, 2]))
    assert a.bonus_tokens.tolist() == [5, 7] and a.topk_p is None
    b = SoTDraftInput.from_bonus(torch.tensor([9], dtype=torch.int32))
    a.merge_batch(b)
    assert a.bonus_tokens.tolist() == [5, 7, 9]


def test_idle_stub_merges_as_the_other_side():
    idle = SoTDraftInput.create_idle_input(device="cpu")
    idle.merge_batch(SoTDraftInput.from_bonus(torch.tensor([3], dtype=torch.int32)))
    assert idle.bonus_tokens.tolist() == [3]
    real = SoTDraftInput.from_bonus(torch.tensor([4], dtype=torch.int32))
    real.merge_batch(SoTDraftInput.create_idle_input(device="cpu"))
    assert real.bonus_tokens.tolist() == [4]


def test_overlap_filter_and_merge_move_only_slot_keys():
    a = SoTDraftInput.from_bonus(torch.tensor([5, 6, 7], dtype=torch.int32))
    a.future_indices = torch.tensor([10, 11, 12])
    a.filter_batch(torch.tensor([1]))
    assert a.future_indices.tolist() == [11] and a.bonus_tokens.tolist() == [5, 6, 7]
    b = SoTDraftInput()
    b.future_indices = torch.tensor([20])
    a.merge_batch(b)
    assert a.future_indices.tolist() == [11, 20]


def test_types_reuse_eagle_members():
    from sglang.srt.speculative.spec_info import SpecInputType

    draft = SoTDraftInput.from_bonus(torch.tensor([1]))
    assert draft.spec_input_type == SpecInputType.EAGLE_DRAFT and draft.is_draft_input()
    verify = SoTVerifyInput(
        draft_token=torch.zeros(4, dtype=torch.long), custom_mask=torch.ones(16, dtype=torch.bool),
        positions=torch.zeros(4, dtype=torch.long), retrieve_index=None, retrieve_next_token=None,
        retrieve_next_sibling=None, retrieve_cum_len=None, spec_steps=3, topk=1, draft_token_num=4,
        capture_hidden_mode=None, seq_lens_sum=None, seq_lens_cpu=None, tree_depth=4,
    )  # fmt: skip
    assert verify.is_verify_input() and verify.max_tree_depth == 4 and verify.tree_topk == -1
    assert verify.num_tokens_per_req == 4


def test_from_eagle_keeps_a_draft_models_top_k():
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    first = EagleDraftInput(
        topk_p=torch.tensor([[0.9], [0.5]]), topk_index=torch.tensor([[7], [8]]),
        bonus_tokens=torch.tensor([3, 4]),
    )  # fmt: skip
    ours = SoTDraftInput.from_eagle(first)
    assert isinstance(ours, SoTDraftInput) and ours.hidden_states is None
    assert torch.equal(ours.topk_index, first.topk_index) and torch.equal(ours.bonus_tokens, first.bonus_tokens)
    ours.filter_batch(torch.tensor([1]))
    assert ours.topk_index.tolist() == [[8]] and ours.bonus_tokens.tolist() == [4]
