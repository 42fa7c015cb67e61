"""SoTFutureMap relays a draft model's top-k between steps on CPU (no Triton gather)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.managers.overlap_utils import RelayPayload

from sglang_specsot.speculative.future_map import SoTFutureMap
from sglang_specsot.speculative.inputs import SoTDraftInput


class _Algo(SimpleNamespace):
    def is_some(self):
        return True

    def is_ngram(self):
        return False

    def need_topk(self):
        return self.topk


@pytest.fixture(autouse=True)
def _no_published_config(monkeypatch):
    # stash() asks SGLang's published spec config whether hidden states travel; a unit
    # test has no scheduler, and neither SPECSOT drafter relays hidden states.
    monkeypatch.setattr("sglang.srt.speculative.spec_utils.spec_need_hidden_states", lambda: False)


def _map(topk: bool) -> SoTFutureMap:
    pool = SimpleNamespace(req_to_token=torch.zeros((8, 16), dtype=torch.int32))
    return SoTFutureMap(torch.device("cpu"), _Algo(topk=topk), pool)


def test_top_k_and_bonus_come_back_by_request_slot():
    fmap = _map(topk=True)
    slots = torch.tensor([2, 5])
    fmap.stash(slots, RelayPayload(
        bonus_tokens=torch.tensor([11, 12]),
        topk_p=torch.tensor([[0.75, 0.25], [0.5, 0.5]]),
        topk_index=torch.tensor([[101, 102], [201, 202]]),
    ))  # fmt: skip
    draft_input = SoTDraftInput(future_indices=torch.tensor([5, 2]))  # the batch was reordered
    fmap._resolve_spec_extras(SimpleNamespace(spec_info=draft_input))
    assert draft_input.bonus_tokens.tolist() == [12, 11]
    assert draft_input.topk_index.tolist() == [[201, 202], [101, 102]]
    assert draft_input.topk_p.tolist() == [[0.5, 0.5], [0.75, 0.25]]
    assert draft_input.hidden_states is None


def test_context_drafting_relays_bonus_tokens_only():
    fmap = _map(topk=False)
    fmap.stash(torch.tensor([1]), RelayPayload(bonus_tokens=torch.tensor([7])))
    draft_input = SoTDraftInput(future_indices=torch.tensor([1]))
    fmap._resolve_spec_extras(SimpleNamespace(spec_info=draft_input))
    assert draft_input.bonus_tokens.tolist() == [7] and draft_input.topk_p is None
