"""The scheduling priority of an admitted SoT answer's branches: one step ahead of its request's.

SGLang's waiting queue is first come, first served: an SoT answer's branches, sent once its
skeleton is done, queue behind every request that arrived while the skeleton ran. On a server
launched with SGLang's `--enable-priority-scheduling` the branches (and the prefill of their
shared prompt) carry their request's priority moved one step toward the front, so they run before
later requests of the same priority and never before requests the client ranked higher. The
skeleton keeps the request's own priority: it is the answer's admission. Without priority
scheduling SGLang ignores priorities and nothing changes. With it, SGLang's priority preemption
(on unless `--disable-priority-preemption`) may retract a running request of the request's own
priority for a branch. Under load, an SoT answer also waits in the SoT gate (`sot/limits.py`,
`max_groups`) before any branch exists, which this does not touch (docs/benchmarks.md, "Load
test": no gain for SoT's latency there, plain's p95 worse).

Plain Python: the serving backend reads the server's settings and passes them in.
"""

from __future__ import annotations


def branch_priority(enabled: bool, request_priority: int | None, default: int | None, low_first: bool) -> int | None:
    """The priority of the branches of a request with `request_priority` (None: unset, which
    SGLang fills with `default`, else 0), or None where the server schedules without priorities.
    `low_first` is SGLang's `--schedule-low-priority-values-first`."""
    if not enabled:
        return None
    base = request_priority if request_priority is not None else (default if default is not None else 0)
    return base - 1 if low_first else base + 1
