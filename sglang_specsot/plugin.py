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


def register() -> None:
    """Check the SGLang version, apply the host changes, register SPECSOT. Idempotent."""
    from sglang_specsot.host_changes import apply_host_changes

    applied: list[str] = []
    try:
        check_sglang_version()
        applied = apply_host_changes()
    except Exception as exc:
        _write_trace(_process_record(applied, f"{type(exc).__name__}: {exc}"))
        raise
    _write_trace(_process_record(applied, None))
