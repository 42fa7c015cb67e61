"""`sgl_kernel` for SGLang's CPU path when no CPU build of sgl-kernel is installed.

`sglang_specsot._bootstrap` loads this package under the name `sgl_kernel` (with this
directory as its package path, so `sgl_kernel.speculative` is `speculative.py` here). SGLang
imports it while importing itself, so nothing here may import SGLang. The ops are plain
functions, not `torch.ops.sgl_kernel` registrations: SGLang probes that namespace to detect a
real AMX build (srt/utils/common.py:352-358) and must keep finding nothing there.
"""

from __future__ import annotations

# Every op SGLang 0.5.23 imports from `sgl_kernel` when is_cpu() on a CPU without AMX, by the
# SGLang module (under the installed `sglang` package) that imports it at import time.
from sglang_specsot.cpu.kernels import (
    assign_draft_cache_locs_contiguous_cpu,  # kernels/ops/speculative/cache_locs.py:28
    assign_extend_cache_locs_cpu,  # kernels/ops/speculative/cache_locs.py:28
    assign_req_to_token_pool_cpu,  # srt/mem_cache/allocation.py:46
    build_tree_kernel_efficient_cpu,  # kernels/ops/speculative/spec_tree.py:40
    copy_all_layer_kv_cache_cpu,  # kernels/ops/kvcache/cache_move.py:10
    fill_accept_out_cache_loc_cpu,  # kernels/ops/speculative/eagle.py:10
    fill_bonus_tokens_cpu,  # kernels/ops/speculative/eagle.py:10
    rotate_input_ids_cpu,  # kernels/ops/speculative/multi_layer_eagle.py:25
    verify_tree_greedy_cpu,  # kernels/ops/speculative/spec_tree.py:43
)

from . import speculative  # noqa: F401  `sgl_kernel.speculative` (reconstruct_tree.py:50)

IS_SGLANG_SPECSOT_SHIM = True

__all__ = [
    "IS_SGLANG_SPECSOT_SHIM",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "speculative",
    "verify_tree_greedy_cpu",
]
