"""`sgl_kernel.quantization`: the GGUF kernels (layers/quantization/gguf.py), imported, never
called for a safetensors bf16 model."""

from __future__ import annotations

from . import _not_here

_NAMES = ("ggml_dequantize", "ggml_moe_a8", "ggml_mul_mat_a8", "ggml_mul_mat_vec_a8")
globals().update({name: _not_here(f"quantization.{name}") for name in _NAMES})
__all__ = list(_NAMES)
