"""SPECSOT's verify graphs are captured with its own verify input and tree mask: SGLang's
decode graph runner asks `get_spec_info` for the capture input (`capture_prepare`), SPECSOT's
runner class answers with SPECSOT's input on the runner's mask buffer at the tier's width, and
the attention backends' capture code, given that input, captures the masked kernel.

The whole capture and replay through SGLang's runner, on a CPU with Triton interpreted, is
scripts/own_capture_twin.py (tests/integration/test_own_capture_twin.py)."""

from __future__ import annotations

import functools
import inspect
from types import SimpleNamespace

import pytest
import torch

from sglang_specsot.host import adapter
from sglang_specsot.speculative.inputs import SoTVerifyInput
from sglang_specsot.speculative.verify_input import dummy_verify_input


def _runner_base():
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner,
    )

    return DecodeCudaGraphRunner


def _spec_algorithm(eagle: bool = False):
    no = lambda: False  # noqa: E731
    return SimpleNamespace(is_eagle=lambda: eagle, is_standalone=no, is_dflash_family=no, is_ngram=no)


def _bare_runner(cls, width: int, capture_hidden: bool = False, eagle: bool = False):
    """An instance of `cls` with what get_spec_info reads and nothing captured (its
    __init__ captures; the twin runs that)."""
    runner = object.__new__(cls)
    runner.buffers = SimpleNamespace(custom_mask=torch.ones(64, dtype=torch.bool))
    runner.speculative_num_draft_tokens = runner.captured_req_width = width
    runner.speculative_num_steps = max(width - 1, 1)
    runner.model_runner = SimpleNamespace(
        model_config=SimpleNamespace(hidden_size=8), dtype=torch.float32, device="cpu", is_draft_worker=False,
        spec_algorithm=_spec_algorithm(eagle), attn_backend=None,
    )  # fmt: skip
    runner.dummy_input = functools.partial(dummy_verify_input, capture_hidden=capture_hidden)
    return runner


def test_own_capture_sglangs_capture_prepare_takes_its_input_from_get_spec_info():
    """SGLang's DecodeCudaGraphRunner.capture_prepare builds the capture ForwardBatch's
    spec_info from `self.get_spec_info(num_tokens)`: the seam SPECSOT's runner overrides."""
    source = inspect.getsource(_runner_base().capture_prepare)
    assert "spec_info = self.get_spec_info(num_tokens)" in source
    assert "spec_info=spec_info," in source
    assert tuple(inspect.signature(_runner_base().get_spec_info).parameters) == (
        "self",
        "num_tokens",
    )


def test_own_capture_sglangs_get_spec_info_gives_specsot_no_input():
    """SGLang's own DecodeCudaGraphRunner.get_spec_info for SPECSOT drafting from its context
    alone (neither EAGLE nor STANDALONE): no input, so no tree mask at capture."""
    runner = _bare_runner(_runner_base(), 4)
    assert _runner_base().get_spec_info(runner, 16) is None


@pytest.mark.parametrize("eagle", [False, True], ids=["context-or-draft-model", "head"])
@pytest.mark.parametrize("width", [2, 4, 8])
def test_own_capture_runner_captures_with_specsots_input_at_the_tiers_width(width, eagle):
    cls = adapter.verify_graph_runner_cls(_runner_base())
    assert issubclass(cls, _runner_base()) and adapter.verify_graph_runner_cls(_runner_base()) is cls
    runner = _bare_runner(cls, width, capture_hidden=eagle, eagle=eagle)
    spec_info = runner.get_spec_info(num_tokens=2 * width)
    assert isinstance(spec_info, SoTVerifyInput)
    assert spec_info.custom_mask is runner.buffers.custom_mask  # the buffer each replay fills
    assert spec_info.num_tokens_per_req == spec_info.draft_token_num == width
    assert spec_info.hidden_states.shape == (2 * width, 8)
    expected = adapter.CaptureHiddenMode.FULL if eagle else adapter.CaptureHiddenMode.NULL
    assert spec_info.capture_hidden_mode == expected  # an EAGLE head reads every row's hidden state


def _flashinfer_capture_asks_mask(spec_info) -> bool:
    """Whether SGLang's FlashInfer capture (FlashInferAttnBackend._prepare_cuda_graph_metadata,
    flashinfer_backend.py:1315-1336) builds its TARGET_VERIFY wrappers with the custom mask,
    given `spec_info`; FlashInfer's wrappers themselves stood in for (no FlashInfer kernels here)."""
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    asked = []
    backend = SimpleNamespace(
        _create_prefill_wrappers=lambda bs, use_custom_mask: asked.append(use_custom_mask) or ["wrapper"],
        prefill_cuda_graph_metadata={},
    )  # fmt: skip
    FlashInferAttnBackend._prepare_cuda_graph_metadata(backend, 2, 8, adapter.ForwardMode.TARGET_VERIFY, spec_info)
    return asked == [True]


def test_own_capture_flashinfer_capture_is_given_the_tree_mask():
    """FlashInfer cannot run here: the input SPECSOT's runner gives capture makes SGLang's
    FlashInfer capture code build masked wrappers, where SGLang's own input (None) does not."""
    specsot = _bare_runner(adapter.verify_graph_runner_cls(_runner_base()), 4)
    assert _flashinfer_capture_asks_mask(specsot.get_spec_info(8))
    assert not _flashinfer_capture_asks_mask(_runner_base().get_spec_info(_bare_runner(_runner_base(), 4), 8))
