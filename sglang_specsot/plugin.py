"""SGLang plugin entry point (group `sglang.srt.plugins`), run in every SGLang process."""

from __future__ import annotations

import json
import logging
import os
import sys

from sglang_specsot import SGLANG_VERSION

logger = logging.getLogger(__name__)

# When set, every process that loads the plugin appends one JSON line here. SGLang logs and
# swallows a plugin's exceptions (sglang/srt/plugins/__init__.py:129-136), so this is how
# tests prove the plugin really ran in the main, scheduler and detokenizer processes.
TRACE_ENV = "SGLANG_SPECSOT_TRACE_FILE"


def check_sglang_version() -> None:
    """Refuse to touch an SGLang other than the one the host changes were written for."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("sglang")
    except PackageNotFoundError as exc:
        raise RuntimeError(
            f"sglang-specsot needs sglang=={SGLANG_VERSION}, but sglang is not installed; "
            "run the README's set-up command"
        ) from exc
    if found != SGLANG_VERSION:
        raise RuntimeError(
            f"sglang-specsot needs sglang=={SGLANG_VERSION}, found sglang=={found}; "
            f"install sglang=={SGLANG_VERSION} (see requirements/) or a matching sglang-specsot"
        )


def _write_trace(record: dict) -> None:
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _sglang_caller() -> str:
    """The SGLang file that called load_plugins(): tells main, scheduler and detokenizer apart."""
    import traceback

    for frame in reversed(traceback.extract_stack()[:-1]):
        path = frame.filename.replace(os.sep, "/")
        if "/sglang/" in path and not path.endswith("sglang/srt/plugins/__init__.py"):
            return path.split("/sglang/", 1)[1]
    return ""


def _process_record(applied: list[str], error: str | None) -> dict:
    import multiprocessing

    from sglang_specsot._bootstrap import using_shim

    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "process": multiprocessing.current_process().name,
        "argv0": sys.argv[0] if sys.argv else "",
        "caller": _sglang_caller(),
        "sgl_kernel_shim": using_shim(),
        "host_changes": applied,
        "error": error,
    }


_LAUNCHERS = ("launch_server.py", "cli/serve.py")


def _argv_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def device_mismatch_message(argv: list[str], cpu_engine: bool, cuda_available: bool) -> str | None:
    """Say what to do when the launch line asks for a device this process cannot give.

    SGLang's own failures here are far from the cause: `--device cpu` without its CPU switch
    dies importing vllm in the scheduler, and a GPU-less host asked for CUDA dies in
    torch._C._cuda_init.
    """
    device = _argv_value(argv, "--device")
    if device == "cpu" and not cpu_engine:
        return (
            "--device cpu needs SGLang's CPU switch: run with SGLANG_USE_CPU_ENGINE=1 "
            "(e.g. SGLANG_USE_CPU_ENGINE=1 python -m sglang.launch_server ... --device cpu)"
        )
    if device in (None, "cuda") and not cpu_engine and not cuda_available:
        return (
            f"--device {device or 'auto'} needs a CUDA GPU, and this host has none; to run on "
            "the CPU use SGLANG_USE_CPU_ENGINE=1 python -m sglang.launch_server ... --device cpu "
            "--attention-backend specsot_cpu"
        )
    return None


def _check_launch_device() -> None:
    if not _sglang_caller().endswith(_LAUNCHERS):
        return
    import torch

    from sglang_specsot._bootstrap import cpu_engine_requested

    message = device_mismatch_message(sys.argv[1:], cpu_engine_requested(), torch.cuda.is_available())
    if message:
        # SystemExit passes load_plugins' `except Exception`: one clear line instead of a
        # traceback from a subprocess minutes later.
        raise SystemExit(f"sglang-specsot: {message}")


def register() -> None:
    """Check the launch line and SGLang version, register the CPU backend, apply host changes
    (host/changes.py: on CPU the OpenMP spin count first; server-side SoT on the chat route
    among them), register SPECSOT.

    Idempotent; SGLang calls it once per process (main, scheduler, detokenizer).
    """
    from sglang_specsot.wiring import apply_host_changes

    applied: list[str] = []
    _check_launch_device()
    try:
        check_sglang_version()
        # Before argparse (launch_server.py:79-81), so `--attention-backend specsot_cpu` parses.
        from sglang_specsot.cpu.attention import register_cpu_attention_backend

        register_cpu_attention_backend()
        # Before ServerArgs resolves (launch_server.py:81): a speculative CPU launch without a
        # backend that verifies drafts gets specsot_cpu, or stops naming the flag.
        from sglang_specsot.cpu.spec_backend import register_spec_backend_choice

        register_spec_backend_choice()
        # Also before ServerArgs resolves: a CPU launch with --dtype auto runs the dtype a
        # start-up timing measures faster here (float32 where bf16 is not native).
        from sglang_specsot.cpu.dtype import register_dtype_choice

        register_dtype_choice()
        applied = apply_host_changes()
        # --speculative-algorithm is a free string resolved after plugins load (launch_server.py:79).
        from sglang_specsot.wiring import register_specsot

        register_specsot()
    except Exception as exc:
        _write_trace(_process_record(applied, f"{type(exc).__name__}: {exc}"))
        raise
    _write_trace(_process_record(applied, None))
