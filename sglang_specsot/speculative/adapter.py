"""Every SGLang private helper the SPECSOT worker uses, behind one module.

These names moved several times in 2026 (e.g. PR #28093); keeping them here means one place to
fix on the next SGLang, and tests/unit/test_spec_adapter.py fails loudly if one disappears.
"""

from __future__ import annotations

import contextlib

from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.kernels.ops.speculative.reconstruct_tree import reconstruct_indices_from_tree_mask_func
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.runtime_context import get_device, get_schedule, get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.layers.moe.utils import (
    speculative_moe_a2a_backend_context,
    speculative_moe_backend_context,
)
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_utils import eagle_sample
from sglang.srt.speculative.spec_utils import (
    GrammarTree,
    build_grammar_vocab_mask,
    commit_mamba_states_after_verify,
    draft_tp_context,
    move_accept_tokens_to_target_kvcache,
    prepare_mamba_track_for_verify,
    record_stream_for_v2_verify,
)
from sglang.srt.speculative.standalone_worker_v2 import StandaloneDraftWorker


@contextlib.contextmanager
def draft_model_context(parallel_layout):
    """What EAGLEWorkerV2 enters around every draft-model forward (eagle_worker_v2.py:1473)."""
    with (
        draft_tp_context(parallel_layout),
        speculative_moe_backend_context(),
        speculative_moe_a2a_backend_context(),
    ):
        yield

__all__ = [
    "BaseSpecWorker",
    "CaptureHiddenMode",
    "EagleDraftInput",
    "ForwardMode",
    "GenerationBatchResult",
    "GrammarTree",
    "assign_extend_cache_locs_func",
    "build_grammar_vocab_mask",
    "commit_mamba_states_after_verify",
    "compute_spec_logprobs",
    "draft_model_context",
    "eagle_sample",
    "get_device",
    "get_schedule",
    "get_spec",
    "move_accept_tokens_to_target_kvcache",
    "prepare_mamba_track_for_verify",
    "reconstruct_indices_from_tree_mask_func",
    "record_stream_for_v2_verify",
    "StandaloneDraftWorker",
]
