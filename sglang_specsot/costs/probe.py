"""Start-up probe of a model's forward cost by rows, for `cost_model.ForwardCost`.

The probe times the model's own weight matrices (every 2-D floating weight outside the
embedding, plus the LM head, which verify applies to every row) on random activations of a
few row counts: the part of a forward that grows with rows. Attention and per-layer overhead
do not grow with rows at these sizes; the worker learns them from real steps.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from sglang_specsot.costs import published
from sglang_specsot.costs.cost_model import ForwardCost

logger = logging.getLogger(__name__)

PROBE_ROWS = (1, 4, 8, 16, 32, 64)

K = TypeVar("K")


def _products(model: torch.nn.Module) -> list[tuple[int, torch.dtype, Callable[[torch.Tensor], torch.Tensor]]]:
    """(input width, dtype, the product) for every weight matrix: a layer with an int8 copy
    (cpu/draft_int8.py) through its quant method, which picks its kernel by rows as a
    forward does; every other weight as a dense product."""
    out, seen = [], set()
    for module in model.modules():
        if getattr(module, "specsot_int8_plan", None) is not None and module.weight.data_ptr() not in seen:
            seen.add(module.weight.data_ptr())
            out.append((module.weight.shape[1], module.weight.dtype, functools.partial(module.quant_method.apply, module)))
    for w in _weights(model):
        if w.data_ptr() not in seen:
            out.append((w.shape[1], w.dtype, functools.partial(torch.nn.functional.linear, weight=w)))
    return out


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    seen: set[int] = set()
    out = []
    named = list(model.named_parameters())
    head = getattr(model, "lm_head", None)
    if head is not None and getattr(head, "weight", None) is not None:
        named.append(("lm_head.weight", head.weight))  # tied heads are listed under embed only
    for name, w in named:
        if w.dim() != 2 or not w.is_floating_point() or ("embed" in name and name != "lm_head.weight"):
            continue
        if w.data_ptr() not in seen:
            seen.add(w.data_ptr())
            out.append(w.detach())
    return out


def _sync(device: torch.device) -> None:
    if device.type != "cpu":
        torch.get_device_module(device).synchronize()


@torch.inference_mode()
def probe_forward_cost(model: torch.nn.Module, rows: tuple[int, ...] = PROBE_ROWS, sweeps: int = 3) -> ForwardCost:
    """Time the model's matrix products at each row count: the best of `sweeps` sweeps over
    every row count, after one warm-up sweep.

    Sweeps rather than repeats of one row count back to back: a disturbance lasting seconds
    (another process starting beside the server) then spoils one sweep's time of a row count,
    not every try of it. With repeats, one disturbed row count, carried to every larger count
    by the monotone fix below, could make the verify window look several times its cost, and
    the server would never draft."""
    products = _products(model)
    assert products, f"{type(model).__name__} has no 2-D floating weights to probe"
    device = next(model.parameters()).device
    inputs = {n: {(k, dt): torch.randn(n, k, device=device, dtype=dt) for k, dt, _ in products} for n in rows}
    best = best_of_sweeps(rows, lambda n: _time_products(products, inputs[n], device), sweeps)
    times = [best[n] for n in rows]
    # Noise can make a larger probe look cheaper; the model assumes cost never falls with rows.
    for i in range(1, len(times)):
        times[i] = max(times[i], times[i - 1])
    return ForwardCost(probe_rows=tuple(rows), probe_ms=tuple(times))


def best_of_sweeps(keys: Sequence[K], time_ms: Callable[[K], float], sweeps: int) -> dict[K, float]:
    """Each key's least time over `sweeps` sweeps through every key in turn, after one
    warm-up sweep (it builds oneDNN's kernels for each shape and warms the caches).

    Sweeps rather than repeats of one key back to back: a disturbance lasting seconds then
    spoils one sweep's time of a key, not every try of it (see `probe_forward_cost`)."""
    best = {key: float("inf") for key in keys}
    for sweep in range(sweeps + 1):
        for key in keys:
            ms = time_ms(key)
            if sweep > 0:
                best[key] = min(best[key], ms)
    return best


def _time_products(products, inputs: dict[tuple[int, torch.dtype], torch.Tensor], device: torch.device) -> float:
    """Milliseconds for one product of every weight with the input of its width."""
    _sync(device)
    start = time.perf_counter()
    for k, dtype, product in products:
        product(inputs[(k, dtype)])
    _sync(device)
    return (time.perf_counter() - start) * 1e3


def probe_after_start_up(result, controller, scheduler, record_step_time):
    """AFTER hook on SchedulerInternalStateController.__init__ (host change row-cost-probe):
    probe the target model once the scheduler has loaded it, unless its spec worker published
    its own curve (SPECSOT measures the same at its start-up). A model the probe cannot time
    leaves the curve unknown, which SoT's routing reports and steps around, rather than
    stopping a server that would otherwise serve."""
    if published.published() is not None:
        return result
    try:
        cost = probe_forward_cost(scheduler.tp_worker.model_runner.model)
    except (AssertionError, AttributeError, RuntimeError) as exc:
        logger.warning("sglang-specsot: no row-cost curve for this server (%s: %s); SoT routes by the router alone",
                       type(exc).__name__, exc)  # fmt: skip
        return result
    published.publish(cost)
    logger.info("sglang-specsot row costs measured at start-up (target, ms by rows): %s", cost.info())
    return result
