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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

_MB = 2**20


class _MallInfo2(ctypes.Structure):
    # glibc >= 2.33, malloc.h: struct mallinfo2, every field a size_t.
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


@functools.cache
def _mallinfo2():
    """glibc's mallinfo2, or None where there is none (musl, macOS, glibc < 2.33)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        function = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    function.argtypes = []
    return function


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


def memory_report(drafter) -> dict:
    """The figures above for this process and SPECSOT's context drafter."""
    return {"malloc": malloc_report(), "python_blocks": sys.getallocatedblocks(), "drafter": drafter.sizes()}

