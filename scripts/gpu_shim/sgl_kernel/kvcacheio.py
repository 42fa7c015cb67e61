"""`sgl_kernel.kvcacheio`: the hierarchical-cache transfers (mem_cache/), imported, never called
without --enable-hierarchical-cache."""

from __future__ import annotations

from . import _not_here

_NAMES = (
    "transfer_kv_all_layer", "transfer_kv_all_layer_direct_lf_pf", "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph", "transfer_kv_all_layer_mla", "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct", "transfer_kv_per_layer", "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_per_layer_mla", "transfer_kv_per_layer_mla_pf_lf", "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
)  # fmt: skip
globals().update({name: _not_here(f"kvcacheio.{name}") for name in _NAMES})
__all__ = list(_NAMES)
