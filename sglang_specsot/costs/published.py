"""The row-cost curve of this scheduler's target model, and its report in /server_info.

One per scheduler process, whatever its speculative algorithm: the SPECSOT worker publishes the
forward cost it prices its steps by (its overhead learned from real steps as it serves); on any
other server the start-up probe does (host change row-cost-probe, `probe.probe_after_start_up`).
/server_info reports it under `specsot_row_costs` (host change server-info-row-costs), which is
how the HTTP process learns it to price SoT by (serving/costs.py). Plain Python.
"""

from __future__ import annotations

from sglang_specsot.costs.cost_model import ForwardCost

REPORT_KEY = "specsot_row_costs"

_published: ForwardCost | None = None


def publish(cost: ForwardCost) -> None:
    """Make `cost` this process's curve (the object itself: what it learns later is reported)."""
    global _published
    _published = cost


def published() -> ForwardCost | None:
    return _published


def add_row_costs_after(result, controller, recv_req):
    """AFTER hook on SchedulerInternalStateController.get_internal_state: the curve, or None
    where no probe has run, under REPORT_KEY."""
    cost = published()
    result.internal_state[REPORT_KEY] = None if cost is None else cost.info()
    return result
