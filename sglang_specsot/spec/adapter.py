"""Every SGLang private helper the SPECSOT worker uses, behind one module.

These names moved several times in 2026 (e.g. PR #28093); keeping them here means one place to
fix on the next SGLang, and tests/unit/test_spec_adapter.py fails loudly if one disappears.
"""

from __future__ import annotations

from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.kernels.ops.speculative.reconstruct_tree import reconstruct_indices_from_tree_mask_func
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.runtime_context import get_device, get_schedule, get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.eagle_utils import eagle_sample
from sglang.srt.speculative.spec_utils import (
    GrammarTree,
    build_grammar_vocab_mask,
    commit_mamba_states_after_verify,
    move_accept_tokens_to_target_kvcache,
    prepare_mamba_track_for_verify,
    record_stream_for_v2_verify,
)

__all__ = [
    "BaseSpecWorker",
    "CaptureHiddenMode",
    "ForwardMode",
    "GenerationBatchResult",
    "GrammarTree",
    "assign_extend_cache_locs_func",
    "build_grammar_vocab_mask",
    "commit_mamba_states_after_verify",
    "compute_spec_logprobs",
    "eagle_sample",
    "get_device",
    "get_schedule",
    "get_spec",
    "move_accept_tokens_to_target_kvcache",
    "prepare_mamba_track_for_verify",
    "reconstruct_indices_from_tree_mask_func",
    "record_stream_for_v2_verify",
]
