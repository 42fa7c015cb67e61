"""Where and how a benchmark run was made: each invocation's command, code commit and machine,
appended to the run directory (a resumed run spans several invocations, maybe machines)."""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

INVOCATIONS_FILE = "invocations.jsonl"


def machine() -> dict:
    """The facts a timing depends on: CPU model and count, memory, OS, Python."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    try:
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        memory_gib = None
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": memory_gib,
            "os": platform.platform(), "python": platform.python_version()}  # fmt: skip


def record_invocation(out: Path, argv: list[str] | None = None, **extra) -> dict:
    """Append this invocation (command line, commit, machine, start time, and `extra`, such
    as how its servers were scheduled) to OUT's record."""
    from sglang_specsot.bench.cells import code_commit

    argv = sys.argv if argv is None else argv
    entry = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": shlex.join(["python", "-m", "sglang_specsot.bench", *argv[1:]]),
             "commit": code_commit(), "machine": machine(), **extra}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    with (out / INVOCATIONS_FILE).open("a") as f:
        f.write(json.dumps(entry) + "\n")
    return entry
