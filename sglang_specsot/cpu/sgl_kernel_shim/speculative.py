"""`sgl_kernel.speculative`: the NGRAM tree op (kernels/ops/speculative/reconstruct_tree.py:50)."""

from __future__ import annotations

from sglang_specsot.cpu.kernels import reconstruct_indices_from_tree_mask

__all__ = ["reconstruct_indices_from_tree_mask"]
