"""Int8 weights for the draft model on CPU, where its bytes, not its answers, set its cost.

At batch 1 a forward on this CPU is bound by reading the weights, so a 0.5B draft costs 0.44
of a 1.5B target's step and a drafted token pays only where it is accepted more often than
that. The draft's weights do not touch what verify accepts (the target decides every token:
greedy output stays the target's), only how often a draft is right, and a per-row int8 copy
of a de-quantized 4-bit GGUF model barely changes its argmax (Qwen2.5-Coder-0.5B: 97.9% the
same token, agreement with the 1.5B 0.765 against 0.752 in bf16, 480 positions).

Each linear layer of the draft model (and its LM head) keeps its weights and gains an int8
copy with one scale per output row; it multiplies with the copy (`aten._weight_int8pack_mm`,
torch's CPU kernel for weight-only int8) for row counts where that was measured faster at
start-up, per weight shape, and with its own weights otherwise: that kernel reads half the
bytes at 1 row but loses to oneDNN's bf16 kernel a few rows up. The layer's quant method
switches to a subclass of its own class, so SGLang's type checks and every other method of it
stay as they were; only `apply` changes.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

# In the server's environment: "auto" (the default) quantizes the draft model on CPU where a
# row count measured faster; "off" keeps its weights as loaded; "on" uses int8 up to the
# largest probed row count for every weight, unmeasured (tests that must reach this path).
DRAFT_INT8_ENV = "SGLANG_SPECSOT_DRAFT_INT8"
PROBE_ROWS = (1, 2, 3, 4, 5, 6, 8)  # 5: the usual SoT branch batch
# Only methods that multiply with the layer's own dense weight are wrapped: a layer already
# quantized by its checkpoint has nothing for this to copy.
_DENSE_METHODS = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod")
_INT8_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The kernel reads a row's K inputs in vectors: with bf16 inputs and K off a multiple of 8 it
# crashed the process (torch 2.14, K = 3, 5, 17, 100), so such layers keep their weights.
K_MULTIPLE = 16


def draft_int8_mode() -> str:
    """The mode `SGLANG_SPECSOT_DRAFT_INT8` asks for; ValueError naming the fix otherwise."""
    value = os.environ.get(DRAFT_INT8_ENV, "auto").strip().lower() or "auto"
    if value not in ("auto", "off", "on"):
        raise ValueError(f"{DRAFT_INT8_ENV}={value!r} is not a mode; use 'auto' (the default), 'off' or 'on'")
    return value


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale per output row: (int8 [N, K], scales [N] in weight's dtype)."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scales.to(weight.dtype)


def int8_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ (q * scales).T (+ bias) for x of any leading shape; dtype of x."""
    flat = x.reshape(-1, x.shape[-1])
    out = torch.ops.aten._weight_int8pack_mm(flat.contiguous(), q, scales)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], q.shape[0])


def uses_int8(layer, x: torch.Tensor) -> bool:
    """Whether `layer` multiplies `x` with its int8 copy: rows within its limit, same dtype."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return 0 < rows <= layer.specsot_int8_rows and x.dtype == layer.specsot_int8_scales.dtype


_SUBCLASSES: dict[type, type] = {}


def _int8_class(cls: type) -> type:
    """`cls` with an `apply` that takes the int8 copy where `uses_int8`, its own `apply` elsewhere.
    Single inheritance and no new slots: Python switches an object's class in place only
    between classes of one layout (a mixin base would change it)."""
    if cls not in _SUBCLASSES:

        def apply(self, layer, x, bias=None):
            if uses_int8(layer, x):
                return int8_linear(x, layer.specsot_int8, layer.specsot_int8_scales, bias)
            return cls.apply(self, layer, x, bias)

        name = f"Int8Draft{cls.__name__}"
        _SUBCLASSES[cls] = type(name, (cls,), {"__module__": __name__, "__qualname__": name, "__slots__": (), "apply": apply})
    return _SUBCLASSES[cls]


@dataclass(frozen=True)
class Int8Summary:
    """What `quantize_draft` did, for the log and /server_info."""

    layers: int  # layers given an int8 copy
    added_mb: float  # their int8 copies and scales
    rows_by_shape: dict[str, int]  # "NxK" -> the largest row count multiplied in int8 (0: never)

    def info(self) -> dict:
        return {"layers": self.layers, "added_mb": round(self.added_mb, 1), "int8_rows_by_shape": self.rows_by_shape}


def dense_layers(model: torch.nn.Module, exclude: set[int] = frozenset()) -> list[torch.nn.Module]:
    """Modules whose quant method multiplies with their own dense 2-D floating weight, once each
    (a tied LM head is the embedding module), skipping weights whose storage is in `exclude`."""
    out, seen = [], set()
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        if type(method).__name__ not in _DENSE_METHODS or not isinstance(weight, torch.Tensor):
            continue
        if weight.dim() != 2 or weight.dtype not in _INT8_DTYPES or weight.device.type != "cpu":
            continue
        if weight.shape[1] % K_MULTIPLE:
            continue
        if id(module) in seen or weight.data_ptr() in exclude:
            continue
        if "apply" in getattr(method, "__dict__", {}):
            continue  # wrapped per instance (SGLang's kernel API logging): a class switch would not show
        if type(method).__name__ == "UnquantizedEmbeddingMethod" and module is not getattr(model, "lm_head", None):
            continue  # an embedding table that is not the LM head is only looked up, never multiplied
        seen.add(id(module))
        out.append(module)
    return out


def quantize_draft(
    model: torch.nn.Module, exclude: set[int] = frozenset(), rows: tuple[int, ...] = PROBE_ROWS, sweeps: int = 3,
    measured: bool = True,
) -> Int8Summary:  # fmt: skip
    """Give every dense layer of `model` an int8 copy used up to the row count measured faster
    for its weight shape; a shape where int8 is never faster keeps only its own weights.
    Unmeasured (`measured=False`), every shape uses it up to the largest of `rows`."""
    layers = dense_layers(model, exclude)
    by_shape: dict[tuple[int, int], list[torch.nn.Module]] = {}
    for layer in layers:
        by_shape.setdefault(tuple(layer.weight.shape), []).append(layer)
    limits = {
        shape: int8_row_limit(group[0].weight, rows, sweeps) if measured else max(rows)
        for shape, group in by_shape.items()
    }
    added, count = 0, 0
    for shape, group in by_shape.items():
        if limits[shape] == 0:
            continue
        for layer in group:
            q, s = quantize_rows(layer.weight)
            layer.specsot_int8, layer.specsot_int8_scales = q, s
            layer.specsot_int8_rows = limits[shape]
            layer.quant_method.__class__ = _int8_class(type(layer.quant_method))
            added += q.numel() * q.element_size() + s.numel() * s.element_size()
            count += 1
    return Int8Summary(count, added / 2**20, {f"{n}x{k}": limits[(n, k)] for n, k in by_shape})


@torch.inference_mode()
def int8_row_limit(weight: torch.Tensor, rows: tuple[int, ...] = PROBE_ROWS, sweeps: int = 3) -> int:
    """The largest row count up to which the int8 product beat the dense one at every probed
    count (best of `sweeps` sweeps after a warm-up); 0 where it did not win at one row."""
    q, s = quantize_rows(weight)
    inputs = {n: torch.randn(n, weight.shape[1], dtype=weight.dtype) for n in rows}
    dense = {n: float("inf") for n in rows}
    packed = dict(dense)
    # Small matrices take ~0.05 ms: time a few products per try so the timer's own cost and
    # one interruption do not decide; an LM head takes ~20 ms and needs no repeats.
    reps = 1 if weight.numel() > 2**25 else 5
    for sweep in range(sweeps + 1):
        for n in rows:
            d = _ms(lambda: torch.nn.functional.linear(inputs[n], weight), reps)
            p = _ms(lambda: int8_linear(inputs[n], q, s, None), reps)
            if sweep > 0:  # the first sweep builds oneDNN's kernels for each shape
                dense[n], packed[n] = min(dense[n], d), min(packed[n], p)
    return row_limit(dense, packed)


def row_limit(dense_ms: dict[int, float], int8_ms: dict[int, float]) -> int:
    """The largest row count up to which int8 was faster at every measured count, 0 if at none."""
    limit = 0
    for n in sorted(dense_ms):
        if int8_ms[n] >= dense_ms[n]:
            break
        limit = n
    return limit


def _ms(fn, reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) * 1e3 / reps
