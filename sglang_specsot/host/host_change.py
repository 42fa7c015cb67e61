"""What one entry of the host-change ledger (host/changes.py) is, and the processes an entry
may be limited to (its `when`).

Apart from the ledger because its two lists of entries (cpu_changes.py, server_changes.py)
build entries, and the ledger, which applies them, imports those lists.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class HostChange:
    """One change to SGLang: a hook on `target`, with its reason and patch."""

    name: str
    target: str  # dotted path, as HookRegistry.register takes it ("environ": the variable)
    # "before" | "after" | "around" | "replace" (HookRegistry's) | "bind" | "environ" |
    # "scoped" (how each is applied: host/changes.py)
    hook_type: str
    # Returns the hook callable (lazy: may import torch/SGLang); None where the factory is
    # code of another package, supplied to apply_host_changes by name (host/changes.py).
    hook: Callable[[], Callable] | None
    why: str  # what SGLang does at file:line and why no public seam served
    patch: str  # file name under patches/
    when: Callable[[], bool] = field(default=lambda: True)


def cpu_only() -> bool:
    """Whether this process runs SGLang's CPU engine (SGLANG_USE_CPU_ENGINE)."""
    from sglang_specsot._bootstrap import cpu_engine_requested

    return cpu_engine_requested()


_HTTP_LAUNCHERS = ("sglang/launch_server.py", "sglang/cli/serve.py")


def http_server_only() -> bool:
    """Whether this is the process of SGLang's HTTP server (the one with the chat route)."""
    # The launchers call load_plugins() under `if __name__ == "__main__"`, so only the
    # server's main process has them on its stack; spawned children do not.
    return any(
        frame.filename.replace(os.sep, "/").endswith(_HTTP_LAUNCHERS) for frame in traceback.extract_stack()
    )
