from __future__ import annotations

import ctypes

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
