"""A width-1 step's draft-extend runs at the window, where its CUDA graph was captured (issue 83,
deliver 6): SGLang's draft-extend graph runner is captured for the full window only and falls
back to an eager forward at any other width (eagle_draft_extend_cuda_graph_runner.py:319)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch

from sglang_specsot.host import adapter as sgl
from sglang_specsot.speculative.model_draft import SoTDraftModel, widened_result

WINDOW = 4


def _draft_model(seen: list) -> SoTDraftModel:
    model = SoTDraftModel.__new__(SoTDraftModel)
    model.verify_width, model.speculative_num_draft_tokens, model.parallel_layout = WINDOW, WINDOW, None
    model.cuda_graph_runner_for_draft_extend = object()  # graphs captured at the window
    model.confidence = False

    def draft_extend(batch, result):  # SGLang's stage: what it is handed, and at which width
        seen.append((model.speculative_num_draft_tokens, result, batch.out_cache_loc.clone()))
        result.next_draft_input = "next draft input"

    model.draft_extend_for_decode = draft_extend
    return model


def test_a_width_1_steps_extend_runs_at_the_window(monkeypatch):
    monkeypatch.setattr(sgl, "draft_model_context", lambda layout: contextlib.nullcontext())
    seen = []
    model = _draft_model(seen)
    bs, seq_lens = 2, torch.tensor([5, 9])
    batch = SimpleNamespace(
        reqs=[None] * bs, seq_lens=seq_lens, req_pool_indices=torch.tensor([1, 0]),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.arange(2 * 32).view(2, 32)),
        out_cache_loc=torch.tensor([37, 9]),  # the width-1 verify's slots
    )  # fmt: skip
    hidden = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    result = SimpleNamespace(
        speculative_num_draft_tokens=1, next_token_ids=torch.tensor([11, 22]), accept_lens=torch.tensor([1, 1]),
        logits_output=SimpleNamespace(hidden_states=hidden), next_draft_input=None,
    )  # fmt: skip
    model.extend_after_verify(batch, result)
    ((width, wide, slots),) = seen
    assert width == WINDOW and wide.speculative_num_draft_tokens == WINDOW
    assert wide.next_token_ids.tolist() == [11] * WINDOW + [22] * WINDOW  # past every accept length
    assert torch.equal(wide.accept_lens, result.accept_lens)
    assert torch.equal(wide.logits_output.hidden_states, hidden.repeat_interleave(WINDOW, dim=0))
    # The window's slots of each request, from its length on (request 0 is pool row 1).
    assert slots.tolist() == [32 + 5, 32 + 6, 32 + 7, 32 + 8, 9, 10, 11, 12]
    assert batch.out_cache_loc.tolist() == [37, 9] and result.speculative_num_draft_tokens == 1
    assert result.next_draft_input == "next draft input" and model.speculative_num_draft_tokens == WINDOW


def test_a_window_wide_steps_extend_is_its_own(monkeypatch):
    monkeypatch.setattr(sgl, "draft_model_context", lambda layout: contextlib.nullcontext())
    seen = []
    model = _draft_model(seen)
    result = SimpleNamespace(speculative_num_draft_tokens=WINDOW, next_draft_input=None)
    model.extend_after_verify(SimpleNamespace(out_cache_loc=torch.arange(WINDOW)), result)
    assert seen[0][0] == WINDOW and seen[0][1] is result


def test_widening_keeps_a_verify_of_the_window_as_it_is():
    result = SimpleNamespace(speculative_num_draft_tokens=2, next_token_ids=torch.tensor([1, 2, 3, 4]),
                             logits_output=SimpleNamespace(hidden_states=None))  # fmt: skip
    wide = widened_result(result, bs=2, window=3)
    assert wide.next_token_ids.tolist() == [1, 2, 2, 3, 4, 4] and result.next_token_ids.tolist() == [1, 2, 3, 4]
