"""SPECSOT's state in SGLang's /server_info (host change server-info-specsot).

/server_info returns each scheduler's internal state (http_server.py:876), collected by
`SchedulerInternalStateController` (managers/scheduler_components/internal_state.py:45),
whose `_add_speculative` reports only the average accept length (and DSpark's records).
The hook adds the spec worker's own report (`speculative_state_report()`, as the upstream diff
would let any worker do): for SPECSOT, under "specsot", the measured cost model, whether
adaptive budgets are on, the acceptance estimates and the last step's plan, and where the
scheduler's memory goes (`speculative/memory.py`).
"""

from __future__ import annotations


def add_speculative_after(result, controller, state):
    """AFTER hook on SchedulerInternalStateController._add_speculative(state)."""
    report = getattr(controller.scheduler.draft_worker, "speculative_state_report", None)
    if callable(report):
        state.update(report())
    return result
