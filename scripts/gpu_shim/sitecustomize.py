"""Stand-ins for SGLang modules that a GPU machine without CuTe DSL (`cutlass`) cannot import.

Python imports `sitecustomize` at start-up from the first folder on sys.path that has one; only
scripts/gpu_check.sh puts this folder there, so every process of the device check (the engine's
scheduler and detokenizer too) installs the finder below. It answers one module name only, with a
module that gives the names SGLang's callers read and never claims a kernel it does not have.

`sglang.kernels.ops.gemm.cutedsl_dual_gemm`: the Blackwell (sm100) dual-GEMM + SwiGLU kernel.
`layers/dual_gemm.py` imports it when building every Qwen2 MLP on CUDA and asks
`can_use_dual_gemm(...)`; SGLang's own answer is False off sm100 (`is_sm100_supported()`), and the
stand-in answers False everywhere, so the MLP runs its unfused gate_up -> SiLU*up -> down path,
as SGLang does on an H100/H200.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from enum import IntEnum

_DUAL_GEMM = "sglang.kernels.ops.gemm.cutedsl_dual_gemm"


class DualGemmQuantMode(IntEnum):
    """SGLang's enum, values and properties as in cutedsl_dual_gemm.py."""

    STATIC_PER_TENSOR = 0
    STATIC_PER_TOKEN = 1
    DYNAMIC_PER_TENSOR = 2
    DYNAMIC_PER_TOKEN = 3
    UNQUANT = 4

    @property
    def is_quantized(self) -> bool:
        return self is not self.UNQUANT

    @property
    def is_dynamic(self) -> bool:
        return self in (self.DYNAMIC_PER_TENSOR, self.DYNAMIC_PER_TOKEN)


def can_use_dual_gemm(num_tokens, hidden_size, intermediate_size, quant_mode) -> bool:
    return False  # no CuTe DSL here: the unfused MLP, as SGLang runs it off sm100


def _no_kernel(*args, **kwargs):
    raise RuntimeError(f"{_DUAL_GEMM} stand-in: the CuTe DSL kernel is not on this machine")


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        module.MAX_DUAL_GEMM_DECODE_TOKENS = 16
        module.DualGemmQuantMode = DualGemmQuantMode
        module.can_use_dual_gemm = can_use_dual_gemm
        module.dual_gemm_swiglu = module.dual_gemm_swiglu_fp8 = _no_kernel
        module.IS_SGLANG_SPECSOT_GPU_SHIM = True


class _StandInFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _DUAL_GEMM:
            return None
        return importlib.machinery.ModuleSpec(name, _StandInLoader(), origin=__file__)


sys.meta_path.insert(0, _StandInFinder())
