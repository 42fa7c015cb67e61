"""`sgl_kernel` for SGLang's CUDA path on a GPU machine without sgl-kernel: torch, not CUDA C++.

Only scripts/gpu_check.sh puts this folder on PYTHONPATH, on a machine where `import
sgl_kernel` fails (sgl-kernel's wheel is built for one torch and is over the device check's
carry limit). SGLang 0.5.23 imports these names at import time when `is_cuda()` (the modules
named beside each); the device check runs the model with SGLANG_FORCE_FUSED_OP_BACKEND=torch,
so most are imported, not called. Where a call does come, the torch version computes what
sgl-kernel's op computes; the ops that a dense bf16 Qwen2 never reaches raise, naming
themselves, so a device run shows exactly which one blocked.

What comes from the CPU runtime: the sampling renormalisations (sglang_specsot/cpu/sampling.py),
device-agnostic torch. Not reusable on a GPU: `copy_all_layer_kv_cache_cpu` (it writes through
host pointers with ctypes), and the CPU-only `*_cpu` ops, which SGLang's CUDA path never calls.
A name missing here raises ImportError at SGLang's import, as a missing sgl-kernel op would:
SGLang's own `try: from sgl_kernel... except ImportError` fallbacks (for example
`sgl_kernel.scalar_type`, layers/quantization/utils.py:21-42) stay in force.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang_specsot.cpu.sampling import top_k_renorm_prob, top_p_renorm_prob

IS_SGLANG_SPECSOT_GPU_SHIM = True


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):  # layers/layernorm.py
    result = _rms(input, weight, eps)
    return result if out is None else out.copy_(result)


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None) -> None:
    """In place, as sgl-kernel: residual += input, then input = rmsnorm(residual)."""
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps))


def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    result = _rms(input, 1.0 + weight.float(), eps).to(input.dtype)
    return result if out is None else out.copy_(result)


def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None) -> None:
    residual.add_(input)
    input.copy_(_rms(residual, 1.0 + weight.float(), eps).to(input.dtype))


def _act_and_mul(act, input: torch.Tensor, out):
    d = input.shape[-1] // 2
    result = act(input[..., :d]) * input[..., d:]
    return result if out is None else out.copy_(result)


def silu_and_mul(input, out=None, enable_pdl=None):  # layers/activation.py:60-62
    return _act_and_mul(F.silu, input, out)


def gelu_and_mul(input, out=None, enable_pdl=None):
    return _act_and_mul(F.gelu, input, out)


def gelu_tanh_and_mul(input, out=None, enable_pdl=None):
    return _act_and_mul(lambda x: F.gelu(x, approximate="tanh"), input, out)


def _not_here(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: not in sglang-specsot's torch stand-in for sgl-kernel "
            "(scripts/gpu_shim); install sgl-kernel to run this path"
        )

    op.__name__ = name
    return op


# Imported at import time by the MoE and int8 paths (fused_moe.py, quantization/), which a
# dense bf16 model never calls.
int8_scaled_mm = _not_here("int8_scaled_mm")
moe_sum = _not_here("moe_sum")
moe_sum_reduce = _not_here("moe_sum_reduce")

# Submodules SGLang imports from (they take `_not_here` from here, so they come last).
from . import kvcacheio, quantization, utils  # noqa: E402,F401

__all__ = [
    "fused_add_rmsnorm", "gelu_and_mul", "gelu_tanh_and_mul", "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm", "int8_scaled_mm", "moe_sum", "moe_sum_reduce", "rmsnorm", "silu_and_mul",
    "top_k_renorm_prob", "top_p_renorm_prob",
]  # fmt: skip
