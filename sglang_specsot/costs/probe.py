"""Start-up probe of a model's forward cost by rows, for `cost_model.ForwardCost`.

The probe times the model's own weight matrices (every one outside the embedding, plus the LM
head, which verify applies to every row) on random activations of a few row counts: the part
of a forward that grows with rows. Attention and per-layer overhead do not grow with rows at
these sizes; the worker learns them from real steps. A quantized layer (FP8, int8, packed
int4 weights) is timed through its quant method, as its forward runs; one the probe cannot
run is left out of the curve, with the reason logged, never failing the server's start-up.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

import torch

from sglang_specsot.costs import published
from sglang_specsot.costs.cost_model import ForwardCost

logger = logging.getLogger(__name__)

PROBE_ROWS = (1, 4, 8, 16, 32, 64)
# Weights the probe multiplies itself; any other weight (FP8, int8, packed int4) is a quantized
# layer's, multiplied by its quant method as a forward does.
DENSE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

K = TypeVar("K")


class Product(NamedTuple):
    """One weight matrix's product with `width`-wide activations of `dtype`."""

    width: int
    dtype: torch.dtype
    run: Callable[[torch.Tensor], torch.Tensor]


class NothingToProbe(RuntimeError):
    """The model has no weight matrix the probe can time."""


def _is_dense(w) -> bool:
    # A weight in a kernel's own layout (oneDNN's packed one, cpu/packed_linear.py) only its
    # layer's quant method can multiply.
    return isinstance(w, torch.Tensor) and w.dim() == 2 and w.dtype in DENSE and w.layout == torch.strided


def storage_key(tensor: torch.Tensor) -> int:
    """What identifies a weight's storage: its data pointer, or, for a tensor in an opaque
    layout that has none (oneDNN's packed weights), the tensor itself."""
    return tensor.data_ptr() if tensor.layout == torch.strided else id(tensor)


def _activation_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype a forward's activations have: the model's own floating parameters' (in a
    quantized checkpoint its embedding and norms keep it)."""
    return next((p.dtype for p in model.parameters() if p.dtype in DENSE), torch.get_default_dtype())


def _layers(model: torch.nn.Module):
    """(name, module) of every module, the LM head under its own name even where it is the
    embedding (tied heads), which verify applies to every row; no other embedding (a lookup)."""
    for name, module in model.named_modules():
        if "embed" not in name:
            yield name, module
    head = getattr(model, "lm_head", None)
    if isinstance(head, torch.nn.Module):
        yield "lm_head", head


def _quant_product(module: torch.nn.Module, activation: torch.dtype) -> Product | str:
    """The layer's product through its quant method's `apply`, as its forward runs it; or why not.

    The input width comes from the layer (SGLang's linear layers: `input_size_per_partition`
    for a row-parallel one, `input_size` otherwise), not its weight, which a quant method
    may store transposed (fp8.py:1173, :1256) or packed."""
    method = getattr(module, "quant_method", None)
    if not callable(getattr(method, "apply", None)):
        return f"{_weight_dtypes(module)} weights and no quant method to multiply them"
    width = getattr(module, "input_size_per_partition", None) or getattr(module, "input_size", None)
    weight = getattr(module, "weight", None)
    if width is None and isinstance(weight, torch.Tensor) and weight.dim() == 2:
        width = weight.shape[1]
    if width is None:
        return "no input width to build its activations from"
    dtype = getattr(module, "params_dtype", None)
    return Product(int(width), dtype if dtype in DENSE else activation, functools.partial(method.apply, module))


def _weight_dtypes(module: torch.nn.Module) -> str:
    return ", ".join(sorted({str(p.dtype) for p in module.parameters(recurse=False) if p.dtype not in DENSE}))


def _plan(model: torch.nn.Module) -> tuple[dict[str, Product], dict[str, str]]:
    """The product of every weight matrix by layer name, and the layers the probe cannot time
    with the reason: a dense matrix directly; a layer with any other weight (or an int8 copy,
    cpu/draft_int8.py) through its quant method, which picks its kernel by rows as a forward
    does."""
    activation = _activation_dtype(model)
    products: dict[str, Product] = {}
    skipped: dict[str, str] = {}
    seen_layers: set[int] = set()  # _layers lists the head twice
    seen_weights: set[int] = set()
    for name, module in _layers(model):
        matrices = {n: p for n, p in module.named_parameters(recurse=False) if p.dim() == 2}
        if getattr(module, "specsot_int8_plan", None) is not None or not all(map(_is_dense, matrices.values())):
            if id(module) not in seen_layers:
                seen_layers.add(id(module))
                product = _quant_product(module, activation)
                (skipped if isinstance(product, str) else products)[name] = product
            continue
        for pname, w in matrices.items():
            if w.data_ptr() not in seen_weights:
                seen_weights.add(w.data_ptr())
                run = functools.partial(torch.nn.functional.linear, weight=w.detach())
                products[f"{name}.{pname}".lstrip(".")] = Product(w.shape[1], w.dtype, run)
    return products, skipped


def _runnable(
    products: dict[str, Product], rows: tuple[int, ...], device: torch.device
) -> tuple[list[Product], dict[str, str]]:
    """The products that run at the fewest and the most rows, and each other one's error.

    Any error drops only its layer: a quant method's kernel may be missing on this device
    (SGLang's int8 and FP8 methods need AMX on a CPU, a driver for Triton), or refuse a shape
    or dtype, in as many ways as there are methods. A row-cost curve is a measurement: a layer
    it leaves out makes the curve cheaper, never the server stop."""
    out, failed = [], {}
    for name, product in products.items():
        try:
            for n in sorted({rows[0], rows[-1]}):
                product.run(torch.randn(n, product.width, device=device, dtype=product.dtype))
        except Exception as exc:  # noqa: BLE001 - see the docstring
            failed[name] = _reason(exc)
        else:
            out.append(product)
    return out, failed


def _reason(exc: Exception) -> str:
    first = str(exc).strip().splitlines()[:1]
    return f"{type(exc).__name__}: {first[0][:200]}" if first else type(exc).__name__


def _log_skipped(model: torch.nn.Module, skipped: dict[str, str]) -> None:
    """One warning for all the layers left out, grouped by reason (a model's layers share one)."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in skipped.items():
        by_reason.setdefault(reason, []).append(name or "(model)")
    groups = "; ".join(f"{_some(names)} ({reason})" for reason, names in by_reason.items())
    logger.warning(
        "sglang-specsot row-cost probe of %s: %d layer(s) not timed, so its curve leaves them out: %s",
        type(model).__name__, len(skipped), groups,
    )  # fmt: skip


def _some(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


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
    the server would never draft. Layers it cannot run are left out and logged (`_runnable`);
    NothingToProbe when that leaves none."""
    device = next(model.parameters()).device
    planned, skipped = _plan(model)
    products, failed = _runnable(planned, rows, device)
    skipped |= failed
    if skipped:
        _log_skipped(model, skipped)
    if not products:
        raise NothingToProbe(f"{type(model).__name__} has no weight matrix the probe can time")
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


def mean_ms(fn: Callable[[], object], reps: int) -> float:
    """Milliseconds per call of `fn` over `reps` calls back to back: one try of a key for
    `best_of_sweeps`, whose first sweep is the warm-up."""
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) * 1e3 / reps


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
    except Exception as exc:  # noqa: BLE001 - a measurement, never a reason to stop the server
        logger.warning("sglang-specsot: no row-cost curve for this server (%s: %s); SoT routes by the router alone",
                       type(exc).__name__, exc)  # fmt: skip
        return result
    published.publish(cost)
    logger.info("sglang-specsot row costs measured at start-up (target, ms by rows): %s", cost.info())
    return result


def unmeasured() -> ForwardCost:
    """A placeholder curve where the probe timed nothing (the policy then never prices a step)."""
    return ForwardCost(probe_rows=(1,), probe_ms=(1.0,))


def probe_or_none(model: torch.nn.Module, which: str) -> ForwardCost | None:
    """`probe_forward_cost(model)`, or None (logged) where the model has no layer the probe can
    time (a quantized checkpoint whose kernels do not run here): the server still starts."""
    try:
        return probe_forward_cost(model)
    except NothingToProbe as exc:
        logger.warning("SPECSOT: no start-up cost curve for the %s (%s); drafting the whole window every step", which, exc)
        return None

