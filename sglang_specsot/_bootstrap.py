"""Supply `sgl_kernel` on a CPU host that has no CPU build of it.

`sglang_specsot_bootstrap.pth` imports this module at interpreter start-up in every Python
process of the environment. That is the only hook early enough: SGLang imports `sgl_kernel`
CPU ops at import time in the main process and again in each scheduler subprocess *before*
that subprocess loads plugins (sglang/srt/managers/scheduler.py:6323).

It only installs a meta-path finder; it imports neither torch nor SGLang, so start-up cost
is one environment lookup. The finder answers for `sgl_kernel` only when
`SGLANG_USE_CPU_ENGINE` is set (SGLang's own switch for its CPU path, utils/common.py:221),
and then:

* no `sgl_kernel` installed -> our torch implementation (`sglang_specsot.cpu.sgl_kernel_shim`);
* an `sgl_kernel` installed that imports and has the CPU ops -> that one, untouched;
* an `sgl_kernel` installed that cannot load here (the PyPI CUDA wheel needs libcuda.so.1)
  or lacks the CPU ops -> our torch implementation, with a warning.

Without `SGLANG_USE_CPU_ENGINE` (every CUDA host) the finder returns None for every name,
so a real `sgl_kernel` is never shadowed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings

SHIM_PACKAGE = "sglang_specsot.cpu.sgl_kernel_shim"
_FORCE_ENV = "SGLANG_SPECSOT_CPU_KERNELS"  # "shim" forces ours, "off" disables the finder
# Ops whose presence marks a real CPU build (registered by its C++ extension under torch.ops).
_CPU_BUILD_MARKER_OPS = ("assign_req_to_token_pool_cpu", "decode_attention_cpu")


def cpu_engine_requested() -> bool:
    """Mirror of SGLang's gate: `is_cpu()` needs SGLANG_USE_CPU_ENGINE truthy."""
    return os.environ.get("SGLANG_USE_CPU_ENGINE", "").strip().lower() in ("1", "true", "yes", "on")


def _shim_dir() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu", "sgl_kernel_shim")


def _shim_spec() -> importlib.machinery.ModuleSpec:
    # Loaded under the name `sgl_kernel`, with the shim directory as its package path, so
    # `sgl_kernel.speculative` and friends resolve to the shim's submodules.
    shim_dir = _shim_dir()
    return importlib.util.spec_from_file_location(
        "sgl_kernel",
        os.path.join(shim_dir, "__init__.py"),
        submodule_search_locations=[shim_dir],
    )


def _real_build_has_cpu_ops(module) -> bool:
    import torch  # only reached when a real sgl_kernel is installed on a CPU host

    namespace = getattr(torch.ops, "sgl_kernel", None)
    return namespace is not None and all(hasattr(namespace, op) for op in _CPU_BUILD_MARKER_OPS)


class _FallbackLoader(importlib.abc.Loader):
    """Loads the installed `sgl_kernel`; swaps in the shim if it cannot serve the CPU path."""

    def __init__(self, real_spec: importlib.machinery.ModuleSpec):
        self.real_spec = real_spec

    def create_module(self, spec):
        return None  # default module creation; exec_module decides the content

    def exec_module(self, module) -> None:
        try:
            self.real_spec.loader.exec_module(module)
            if _real_build_has_cpu_ops(module):
                return
            reason = "it has no CPU ops (a CUDA build)"
        except (ImportError, OSError) as exc:
            reason = f"it failed to load: {exc}"
        warnings.warn(
            f"sglang-specsot: the installed sgl_kernel cannot serve SGLang's CPU path ({reason}); "
            "using sglang-specsot's torch implementation instead. Install a CPU build of "
            "sgl-kernel to use SGLang's native CPU kernels.",
            RuntimeWarning,
            stacklevel=2,
        )
        shim = _shim_spec()
        module.__file__ = shim.origin
        module.__path__ = list(shim.submodule_search_locations)
        module.__spec__ = shim
        shim.loader.exec_module(module)


class SglKernelCpuFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder for the top-level `sgl_kernel` module on SGLang's CPU path."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "sgl_kernel" or not cpu_engine_requested():
            return None
        mode = os.environ.get(_FORCE_ENV, "auto").strip().lower()
        if mode == "off":
            return None
        if mode == "shim":
            return _shim_spec()
        real = importlib.machinery.PathFinder.find_spec(fullname, path)
        if real is None:
            return _shim_spec()
        real.loader = _FallbackLoader(real)
        return real


def using_shim() -> bool:
    """True when the `sgl_kernel` imported in this process is sglang-specsot's shim."""
    module = sys.modules.get("sgl_kernel")
    return bool(module is not None and getattr(module, "IS_SGLANG_SPECSOT_SHIM", False))


def install() -> None:
    if not any(isinstance(f, SglKernelCpuFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, SglKernelCpuFinder())


install()
