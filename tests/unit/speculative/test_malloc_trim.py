from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from sglang_specsot.speculative import malloc_trim
from sglang_specsot.speculative.malloc_trim import TRIM_ENV, MallocTrim, interval_from_env


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_interval_defaults_and_reads_the_environment():
    assert interval_from_env({}) == malloc_trim.DEFAULT_INTERVAL_S
    assert interval_from_env({TRIM_ENV: " 12.5 "}) == 12.5
    assert interval_from_env({TRIM_ENV: "0"}) == 0


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf", "90000"])
def test_a_bad_interval_names_the_variable_and_the_fix(value):
    with pytest.raises(ValueError, match=f"{TRIM_ENV}='{value}' is not a number of seconds.*or 0 to turn"):
        interval_from_env({TRIM_ENV: value})


def test_trims_at_most_once_per_interval_and_counts_each():
    clock, calls = _Clock(), []
    trimmer = MallocTrim(30.0, clock=clock, trim=calls.append)
    assert not trimmer.tick()  # the first interval starts at start-up
    clock.now += 29.9
    assert not trimmer.tick()
    clock.now += 0.2
    assert trimmer.tick() and calls == [0]
    assert not trimmer.tick()  # the next one is an interval later
    clock.now += 30
    assert trimmer.tick() and calls == [0, 0]
    report = trimmer.report()
    assert report["trims"] == 2 and report["interval_s"] == 30.0
    assert set(report) == {"interval_s", "trims", "seconds_total", "last_ms", "released_mb_total"}


def test_zero_interval_never_trims():
    clock, calls = _Clock(), []
    trimmer = MallocTrim(0.0, clock=clock, trim=calls.append)
    clock.now += 1e6
    assert not trimmer.enabled and not trimmer.tick() and calls == []


def test_without_glibc_it_reports_unavailable_and_never_trims(monkeypatch):
    monkeypatch.setattr(malloc_trim, "_malloc_trim", lambda: None)
    trimmer = MallocTrim(30.0, clock=_Clock())
    assert not trimmer.enabled and not trimmer.tick()
    assert trimmer.report() == {"available": False}


_FREED_BUT_KEPT = textwrap.dedent(
    """
    import ctypes, json
    from sglang_specsot.speculative.malloc_trim import MallocTrim, rss_mb
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # 32 KiB blocks come from the heap (below glibc's mmap threshold); the last one stays, so
    # the freed ones cannot merge into the heap's top and be returned by free itself.
    blocks = [libc.malloc(32 * 1024) for _ in range(4000)]
    for b in blocks:
        ctypes.memset(b, 1, 32 * 1024)
    for b in blocks[:-1]:
        libc.free(b)
    kept = rss_mb()
    now = [0.0]
    trimmer = MallocTrim(1.0, clock=lambda: now[0])
    now[0] = 2.0
    trimmer.tick()
    print(json.dumps({"kept": kept, "trimmed": rss_mb(), "report": trimmer.report()}))
    """
)


@pytest.mark.skipif(malloc_trim._malloc_trim() is None or malloc_trim.rss_mb() is None,
                    reason="needs glibc's malloc_trim and /proc")  # fmt: skip
def test_a_trim_returns_freed_heap_memory_to_the_system():
    out = subprocess.run([sys.executable, "-c", _FREED_BUT_KEPT], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    # 125 MB freed in the middle of the heap: RSS keeps it until the trim gives it back.
    assert result["kept"] - result["trimmed"] >= 100, result
    assert result["report"]["trims"] == 1 and result["report"]["released_mb_total"] >= 100, result
