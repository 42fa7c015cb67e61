"""Give the C allocator's kept free memory back to the system, every so often, from the scheduler.

glibc keeps the memory a process frees (`free_kept_mb` in `memory.py`'s report) for reuse, and
returns to the system only what lies at the top of the main heap. A serving scheduler frees
in the middle of its heaps all the time (token lists, index tables, per-step tensors), so its
RSS climbs by what glibc keeps even though the memory in use is flat: under a 30-minute load
one replica's kept memory rose from ~150 to 250 MB. `malloc_trim(0)` (glibc >= 2.8) walks every
arena and hands back each whole free page in it.

Invariant: at most one trim per `interval_s` of the scheduler's steps, none where glibc's
`malloc_trim` is missing (musl, macOS), and what each costs and frees is counted in
`/server_info` (`specsot.memory.trim`), so its price is read, not assumed.
"""

from __future__ import annotations

import ctypes
import functools
import os
import time

from sglang_specsot.speculative.memory import libc_function

TRIM_ENV = "SGLANG_SPECSOT_MALLOC_TRIM_S"
DEFAULT_INTERVAL_S = 30.0
_MB = 2**20


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where there is none."""
    return libc_function("malloc_trim", ctypes.c_int, [ctypes.c_size_t])


def rss_mb() -> float | None:
    """This process's resident memory in MB, from /proc (None where there is no /proc)."""
    try:
        with open("/proc/self/statm") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / _MB


def interval_from_env(environ=os.environ) -> float:
    """Seconds between trims from SGLANG_SPECSOT_MALLOC_TRIM_S (0 turns trimming off)."""
    raw = environ.get(TRIM_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:  # NaN fails it too
        raise ValueError(
            f"{TRIM_ENV}={raw!r} is not a number of seconds from 0 to 86400; set it to e.g. 30 "
            "(seconds between trims of the scheduler's kept heap memory) or 0 to turn trimming off"
        )
    return value


class MallocTrim:
    """Trims the process's heaps when `tick` is called at least `interval_s` after the last trim."""

    def __init__(self, interval_s: float, clock=time.monotonic, trim=None) -> None:
        self.trim = _malloc_trim() if trim is None else trim
        self.interval_s = interval_s if self.trim is not None else 0.0
        self.clock = clock
        self._next = clock() + interval_s
        self.trims = 0
        self.seconds = 0.0
        self.released_mb = 0.0
        self.last_ms = 0.0

    @classmethod
    def from_env(cls, environ=os.environ) -> MallocTrim:
        return cls(interval_from_env(environ))

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    def tick(self) -> bool:
        """Trim if the interval has passed since the last trim; True when it did."""
        if not self.enabled:
            return False
        now = self.clock()
        if now < self._next:
            return False
        before = rss_mb()
        start = time.perf_counter()
        self.trim(0)
        took = time.perf_counter() - start
        after = rss_mb()
        self._next = self.clock() + self.interval_s
        self.trims += 1
        self.seconds += took
        self.last_ms = took * 1e3
        if before is not None and after is not None:
            self.released_mb += max(0.0, before - after)
        return True

    def report(self) -> dict:
        if self.trim is None:
            return {"available": False}
        return {
            "interval_s": self.interval_s,
            "trims": self.trims,
            "seconds_total": round(self.seconds, 3),
            "last_ms": round(self.last_ms, 2),
            "released_mb_total": round(self.released_mb, 1),
        }
