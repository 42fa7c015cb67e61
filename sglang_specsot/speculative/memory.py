"""Where the scheduler's memory goes: the figures /server_info shows under specsot.memory.

They are part of SPECSOT's report (host change server-info-specsot), computed when asked. A
load test sees only the scheduler's RSS, which cannot tell a bounded structure filling up
from a leak, nor either from freed memory the C allocator keeps. These figures can:

- `malloc`: glibc's own totals over all arenas (mallinfo2): heap bytes in use, free bytes it
  keeps (fragmentation, or room it will reuse), and large blocks served by mmap (tensors).
  RSS rising while `in_use_mb` stays flat is memory the allocator holds, not a leak.
- `python_blocks`: objects CPython's small-object allocator holds (`sys.getallocatedblocks`).
- `drafter`: what SPECSOT's context drafter keeps (requests, SoT groups, finished siblings'
  tokens, the shared corpus), each bounded by `ContextDraftConfig`.
- `python_trace`, only with `SGLANG_SPECSOT_TRACEMALLOC=FRAMES` (a leak hunt; tracing slows
  the scheduler): Python's allocations by allocating stack, the largest and those that grew
  since the previous report. `in_use_mb` rising while `traced_mb` stays flat puts the growth
  outside Python (torch, tokenizers, glibc), and `grown_since_last` names a Python owner.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
import tracemalloc

_MB = 2**20


class _MallInfo2(ctypes.Structure):
    # glibc >= 2.33, malloc.h: struct mallinfo2, every field a size_t.
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


def libc_function(name: str, restype, argtypes: list):
    """The C library's function `name`, typed, or None where the library lacks it."""
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None
    function.restype, function.argtypes = restype, argtypes
    return function


@functools.cache
def _mallinfo2():
    """glibc's mallinfo2, or None where there is none (musl, macOS, glibc < 2.33)."""
    return libc_function("mallinfo2", _MallInfo2, [])


def malloc_report() -> dict | None:
    """The C allocator's totals in MB, or None where glibc's mallinfo2 is missing."""
    function = _mallinfo2()
    if function is None:
        return None
    info = function()
    return {
        "heap_mb": round(info.arena / _MB, 1),  # sbrk'd and arena heaps, all arenas
        "in_use_mb": round(info.uordblks / _MB, 1),  # of which handed out
        "free_kept_mb": round(info.fordblks / _MB, 1),  # of which free, kept by malloc
        "mmapped_mb": round(info.hblkhd / _MB, 1),  # large blocks, each its own mapping
    }


def memory_report(drafter, trace: PythonTrace | None = None) -> dict:
    """The figures above for this process and SPECSOT's context drafter."""
    report = {"malloc": malloc_report(), "python_blocks": sys.getallocatedblocks(), "drafter": drafter.sizes()}
    if trace is not None:
        report["python_trace"] = trace.report()
    return report


TRACE_ENV = "SGLANG_SPECSOT_TRACEMALLOC"


class PythonTrace:
    """tracemalloc over this process, started with `frames` frames per allocation."""

    def __init__(self, frames: int, top: int = 12) -> None:
        tracemalloc.start(frames)
        self.top = top
        self._last: tracemalloc.Snapshot | None = None

    @classmethod
    def from_env(cls, environ=os.environ) -> PythonTrace | None:
        raw = environ.get(TRACE_ENV, "").strip()
        if not raw:
            return None
        if not raw.isdigit() or not 1 <= int(raw) <= 64:
            raise ValueError(
                f"{TRACE_ENV}={raw!r} is not a frame count from 1 to 64; set it to e.g. 8 "
                "(frames kept per traced allocation), or unset it"
            )
        return cls(int(raw))

    def report(self) -> dict:
        # Snapshots exclude tracemalloc's own bookkeeping; the previous one is kept for the diff.
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        current, peak = tracemalloc.get_traced_memory()
        report = {
            "traced_mb": round(current / _MB, 1),
            "peak_mb": round(peak / _MB, 1),
            "largest": [_stat(s.size, s.count, s.traceback) for s in snapshot.statistics("traceback")[: self.top]],
        }
        if self._last is not None:
            grown = [d for d in snapshot.compare_to(self._last, "traceback") if d.size_diff > 0]
            report["grown_since_last"] = [
                {**_stat(d.size, d.count, d.traceback), "grown_mb": round(d.size_diff / _MB, 3)}
                for d in sorted(grown, key=lambda d: d.size_diff, reverse=True)[: self.top]
            ]
        self._last = snapshot
        return report


def _stat(size: int, count: int, traceback: tracemalloc.Traceback) -> dict:
    # Most recent frame first; paths from the package root (site-packages or the checkout).
    where = [f"{_short(frame.filename)}:{frame.lineno}" for frame in reversed(traceback)]
    return {"mb": round(size / _MB, 3), "blocks": count, "stack": where}


def _short(path: str) -> str:
    if "site-packages/" in path:
        return path.rsplit("site-packages/", 1)[1]
    if "sglang_specsot/" in path:
        return "sglang_specsot/" + path.rsplit("sglang_specsot/", 1)[1]
    return path
