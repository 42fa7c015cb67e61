"""SGLANG_CPU_OMP_THREADS_BIND honoured where SGLang does not bind (cpu/threads.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sglang_specsot.cpu import threads
from sglang_specsot.cpu.threads import BIND_ENV, parse_cpulist, threads_bind_around


@pytest.mark.parametrize("text, cpus", [("0", [0]), ("1", [1]), ("0-3", [0, 1, 2, 3]), ("0-1,4, 6-7", [0, 1, 4, 6, 7])])
def test_a_cpulist_reads_as_linux_writes_it(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["a", "0-x", ""])
def test_a_bad_cpulist_names_the_variable_and_the_text(text):
    with pytest.raises(ValueError, match=rf"{BIND_ENV}: {text!r}"):
        parse_cpulist(text)


@pytest.mark.parametrize("env, sglang_binds, bound", [("0|1", False, [[1]]), ("0|1", True, []), ("", False, [])])
def test_the_hook_binds_only_what_the_user_asked_and_sglang_left(monkeypatch, env, sglang_binds, bound):
    calls, seen = [], []
    monkeypatch.setenv(BIND_ENV, env)
    monkeypatch.setattr(threads, "bind_process", lambda cpus: calls.append(cpus) or cpus)
    original = lambda **kwargs: seen.append(kwargs) or "done"  # noqa: E731
    result = threads_bind_around(original, local_omp_cpuid="1", dist_init_method=None,
                                 sglang_binds=lambda: sglang_binds)  # fmt: skip
    assert result == "done" and seen == [{"local_omp_cpuid": "1", "dist_init_method": None}]
    assert calls == bound


def test_binding_pins_every_thread_and_sizes_torchs_pool():
    code = """
import json, os, threading
from sglang_specsot.cpu.threads import bind_process
early = threading.Event(); threading.Thread(target=early.wait, daemon=True).start()
bound = bind_process([0])
later = {}
t = threading.Thread(target=lambda: later.update(cpus=sorted(os.sched_getaffinity(0)))); t.start(); t.join()
tasks = [sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")]
import torch
print(json.dumps({"bound": bound, "tasks": tasks, "later": later["cpus"], "threads": torch.get_num_threads()}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["bound"] == [0] and got["threads"] == 1 and got["later"] == [0]
    assert all(cpus == [0] for cpus in got["tasks"]), got["tasks"]  # the thread started before, too
