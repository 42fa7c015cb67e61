from __future__ import annotations

import ctypes
import tracemalloc

import pytest

from sglang_specsot.speculative import memory
from sglang_specsot.speculative.context_draft import ContextDrafter


@pytest.mark.skipif(memory.malloc_report() is None, reason="needs glibc's mallinfo2")
def test_malloc_report_sees_heap_memory_handed_out_and_given_back():
    before = memory.malloc_report()
    # 64 KiB blocks stay below glibc's mmap threshold, so they come from the heap.
    blocks = [ctypes.create_string_buffer(64 * 1024) for _ in range(160)]
    during = memory.malloc_report()
    assert during["in_use_mb"] - before["in_use_mb"] >= 9, (before, during)
    del blocks
    after = memory.malloc_report()
    assert during["in_use_mb"] - after["in_use_mb"] >= 9, (during, after)
    assert set(after) == {"heap_mb", "in_use_mb", "free_kept_mb", "mmapped_mb"}


def test_memory_report_counts_what_the_drafter_keeps():
    drafter = ContextDrafter()
    drafter.start("a", [1, 2, 3], group="g")
    report = memory.memory_report(drafter)
    assert report["python_blocks"] > 0
    assert report["drafter"] == {"requests": 1, "groups": 1, "finished_sibling_tokens": 0, "corpus_tokens": 0}
    drafter.forget("a")  # a finished SoT member stays as its siblings' context
    assert memory.memory_report(drafter)["drafter"]["finished_sibling_tokens"] == 3


@pytest.fixture
def trace():
    trace = memory.PythonTrace(frames=4, top=5)
    yield trace
    tracemalloc.stop()


def _hold_strings(n: int) -> list[str]:
    return [f"kept string number {i:08d}" for i in range(n)]


def test_python_trace_names_the_allocation_that_grew(trace):
    first = trace.report()
    assert "grown_since_last" not in first and first["traced_mb"] >= 0
    held = _hold_strings(100_000)  # about 7 MB of str objects, allocated in _hold_strings
    second = memory.memory_report(ContextDrafter(), trace)["python_trace"]
    top = second["grown_since_last"][0]
    assert top["grown_mb"] > 4 and top["stack"][0].endswith(f"test_memory.py:{_hold_strings.__code__.co_firstlineno + 1}")
    assert second["traced_mb"] - first["traced_mb"] > 4 and len(second["largest"]) <= 5
    del held
    third = trace.report()
    assert not any("test_memory.py" in g["stack"][0] for g in third["grown_since_last"])  # freed: no growth


@pytest.mark.parametrize("value", ["yes", "0", "65", "-3"])
def test_python_trace_refuses_a_value_that_is_not_a_frame_count(value):
    with pytest.raises(ValueError, match=f"SGLANG_SPECSOT_TRACEMALLOC='{value}' is not a frame count"):
        memory.PythonTrace.from_env({memory.TRACE_ENV: value})
    assert memory.PythonTrace.from_env({}) is None and not tracemalloc.is_tracing()
