"""`sgl_kernel.utils` (layers/attention/triton_backend.py:71)."""

from __future__ import annotations


def is_arch_support_pdl() -> bool:
    """No programmatic dependent launch: the torch stand-ins launch plain kernels."""
    return False
