"""Int8 weights for the draft model on CPU, where its bytes, not its answers, set its cost.

At batch 1 a forward on a CPU is bound by reading the weights, so a draft model costs a
sizeable share of the target's step and a drafted token pays only where it is accepted more
often than that share. The draft's weights do not touch what verify accepts (the target
decides every token: greedy output stays the target's), only how often a draft is right, and
a per-row int8 copy barely changes the draft's argmax (docs/benchmarks.md).

Each linear layer of the draft model (and its LM head) keeps its weights and gains int8
copies with one scale per output row, multiplied by one of two kernels:
- `int8`: weight-only (`aten._weight_int8pack_mm`, torch's CPU kernel), exact activations;
  it reads half the bytes at 1 row but loses to oneDNN's bf16 kernel from a few rows on.
- `w8a8`: fbgemm's dynamic int8 linear (`quantized::linear_dynamic`), which also quantizes
  the activations (8 bits; 7 where the machine's kernel would overflow), with one scale for
  all rows of the call: usually the fastest of the three at every row count, but coarser (its
  argmax departs from bf16's more often than `int8`'s, and more so as rows share a scale).
For each weight shape and probed row count the kernel measured fastest at start-up is used
(the weights as loaded included; `w8a8` only where it beats `int8` by `W8A8_MARGIN`, for its
coarser answers, and where its products stay within what its rounding allows), for counts up
to the largest probed and the weights as loaded above it.
The layer's quant method switches to a subclass of its own class, so SGLang's type checks
and every other method of it stay as they were; only `apply` changes.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field

import torch

from sglang_specsot.costs.probe import best_of_sweeps, mean_ms, storage_key
from sglang_specsot.cpu.packed_linear import linear, strided

logger = logging.getLogger(__name__)

# In the server's environment: "auto" (the default) quantizes the draft model on CPU where a
# row count measured faster; "off" keeps its weights as loaded; "on" uses the `int8` kernel
# up to INT8_FORCED_ROWS rows and "w8a8" the `w8a8` kernel up to the largest probed row count,
# for every weight, unmeasured (tests that must reach that path).
DRAFT_INT8_ENV = "SGLANG_SPECSOT_DRAFT_INT8"
MODES = ("auto", "off", "on", "w8a8")
# 5: the usual SoT branch batch; 10 and 16: a batch's draft-extends (2 rows a request).
PROBE_ROWS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
# `w8a8` answers more coarsely than `int8` (module docstring): taken only this much faster.
W8A8_MARGIN = 0.9
# ... and only where its products stay within what rounding their activations allows
# (`w8a8_error` at most 1, checked at start-up on each weight shape): a kernel off by more
# answers more coarsely than the quantization the margin was measured for.
W8A8_MAX_ERROR = 1.0
# The output rows of each weight that check multiplies: one kernel serves every row.
W8A8_CHECK_ROWS = 256
DENSE, INT8, W8A8 = "dense", "int8", "w8a8"
FORCED_KERNEL = {"on": INT8, "w8a8": W8A8}  # the unmeasured modes' kernel
# `int8` wins only at the smallest row counts (bf16, module docstring), and in float32 its
# cost grows steeply with every row: forced wider, it would reach no path "auto" takes and
# make float32 parity runs many times slower. Dense above it.
INT8_FORCED_ROWS = 4
# Only methods that multiply with the layer's own dense weight are wrapped: a layer already
# quantized by its checkpoint has nothing for this to copy.
_DENSE_METHODS = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod")
_INT8_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The kernel reads a row's K inputs in vectors: with bf16 inputs and K off a multiple of 8 it
# crashes the process (torch 2.14, K = 3, 5, 17, 100), so such layers keep their weights.
K_MULTIPLE = 16


def draft_int8_mode() -> str:
    """The mode `SGLANG_SPECSOT_DRAFT_INT8` asks for; ValueError naming the fix otherwise."""
    value = os.environ.get(DRAFT_INT8_ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(
            f"{DRAFT_INT8_ENV}={value!r} is not a mode; use 'auto' (the default), 'off', 'on' or 'w8a8'"
        )
    if value == "w8a8" and not w8a8_available():
        raise ValueError(f"{DRAFT_INT8_ENV}=w8a8 needs torch's fbgemm engine, which this machine lacks; use 'auto'")
    return value


def row_scales(w: torch.Tensor) -> torch.Tensor:
    """Symmetric int8's scale of each output row of float32 `w`: [N] float32."""
    return (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale per output row: (int8 [N, K], scales [N] in weight's dtype)."""
    w = weight.detach().float()
    scales = row_scales(w)
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scales.to(weight.dtype)


def int8_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ (q * scales).T (+ bias) for x of any leading shape; dtype of x."""
    flat = x.reshape(-1, x.shape[-1])
    out = torch.ops.aten._weight_int8pack_mm(flat.contiguous(), q, scales)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], q.shape[0])


def w8a8_available() -> bool:
    """Whether torch has fbgemm's dynamic int8 linear here (x86 builds)."""
    return torch.backends.quantized.engine in ("fbgemm", "x86")


def pack_w8a8(weight: torch.Tensor):
    """fbgemm's packed int8 weight, one scale per output row (the rows of `quantize_rows`)."""
    w = weight.detach().float()
    zero = torch.zeros(w.shape[0], dtype=torch.long)
    wq = torch.quantize_per_channel(w, row_scales(w).double(), zero, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(wq, None)


def w8a8_linear(x: torch.Tensor, packed, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W.T (+ bias) with x quantized on the fly (one scale for the call); dtype of x.
    8-bit activations, 7-bit where this machine's kernel would overflow (`w8a8_reduce_range`)."""
    flat = x.reshape(-1, x.shape[-1]).float().contiguous()
    out = torch.ops.quantized.linear_dynamic(flat, packed, w8a8_reduce_range()).to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


@functools.cache
def w8a8_reduce_range() -> bool:
    """Whether fbgemm's kernel here needs 7-bit activations. Without VNNI (AVX2; AVX-512 before
    it) it multiplies uint8 activations by int8 weights into int16 a pair at a time
    (vpmaddubsw), which saturates past 32767: 255 * 127 * 2 does, 127 * 127 * 2 does not; VNNI
    (vpdpbusd) adds the pairs in int32. A product built to overflow shows which kernel runs."""
    ones = torch.ones(8, 32)
    out = torch.ops.quantized.linear_dynamic(torch.ones(1, 32), pack_w8a8(ones), False)
    return not torch.allclose(out, torch.full_like(out, 32.0))


@torch.inference_mode()
def w8a8_error(weight: torch.Tensor, rows: tuple[int, ...] = PROBE_ROWS) -> float:
    """The largest error of `w8a8_linear` over its bound, on random inputs of each of `rows` rows
    and the first W8A8_CHECK_ROWS output rows of `weight` (at most 1 for a kernel that computes
    what its quantization says). Rounding moves an activation at most half its call's step s,
    so output j at most s / 2 * sum_k |w_jk| (w: the int8 weights de-quantized, whose own
    rounding `int8` shares), plus float32's rounding of the kernel's integer sums (each under
    `levels` steps per unit of weight; four roundings) and the output's to x's dtype (u)."""
    packed = pack_w8a8(weight[:W8A8_CHECK_ROWS])
    wq, _ = torch.ops.quantized.linear_unpack(packed)
    w = wq.int_repr().double() * wq.q_per_channel_scales().double()[:, None]
    levels = 127 if w8a8_reduce_range() else 255
    u = torch.finfo(weight.dtype).eps / 2
    worst = 0.0
    for n in rows:
        x = torch.randn(n, w.shape[1], dtype=weight.dtype)
        exact = x.double() @ w.T
        step = float(x.max().clamp_min(0) - x.min().clamp_max(0)) / levels
        bound = step * w.abs().sum(1) * (0.5 + levels * 2.0**-22) * (1 + u) + u * exact.abs()
        error = (w8a8_linear(x, packed, None).double() - exact).abs()
        worst = max(worst, float((error / bound.clamp_min(torch.finfo(torch.float64).tiny)).max()))
    return worst


def int8_kernel(layer, x: torch.Tensor) -> str:
    """The kernel `layer` multiplies `x` with: its plan's for x's row count (the plan covers
    counts 1..len), its own weights for other counts and dtypes."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    plan = layer.specsot_int8_plan
    if not 0 < rows <= len(plan) or x.dtype != layer.weight.dtype:
        return DENSE
    return plan[rows - 1]


_SUBCLASSES: dict[type, type] = {}


def _int8_class(cls: type) -> type:
    """`cls` with an `apply` that takes the kernel `int8_kernel` names, its own `apply` for dense.
    Single inheritance and no new slots: Python switches an object's class in place only
    between classes of one layout (a mixin base would change it)."""
    if cls not in _SUBCLASSES:

        def apply(self, layer, x, bias=None):
            kernel = int8_kernel(layer, x)
            if kernel == INT8:
                return int8_linear(x, layer.specsot_int8, layer.specsot_int8_scales, bias)
            if kernel == W8A8:
                return w8a8_linear(x, layer.specsot_w8a8, bias)
            return cls.apply(self, layer, x, bias)

        name = f"Int8Draft{cls.__name__}"
        _SUBCLASSES[cls] = type(name, (cls,), {"__module__": __name__, "__qualname__": name, "__slots__": (), "apply": apply})
    return _SUBCLASSES[cls]


@dataclass(frozen=True)
class Int8Summary:
    """What `quantize_draft` did, for the log and /server_info."""

    layers: int  # layers given an int8 copy
    added_mb: float  # their int8 copies and scales
    kernels_by_shape: dict[str, list]  # "NxK" -> [[kernel, first row count, last], ...]
    w8a8_error: dict[str, float] = field(default_factory=dict)  # "NxK" -> `w8a8_error`, where measured

    def info(self) -> dict:
        return {
            "layers": self.layers, "added_mb": round(self.added_mb, 1), "kernels_by_shape": self.kernels_by_shape,
            "w8a8_error": {shape: round(error, 3) for shape, error in self.w8a8_error.items()},
        }  # fmt: skip


def plan_ranges(plan: tuple[str, ...]) -> list:
    """A plan (kernel by row count 1..len) as [[kernel, first, last], ...] runs; [] for none."""
    runs: list = []
    for rows, kernel in enumerate(plan, start=1):
        if runs and runs[-1][0] == kernel:
            runs[-1][2] = rows
        else:
            runs.append([kernel, rows, rows])
    return runs


def dense_layers(model: torch.nn.Module, exclude: set[int] = frozenset()) -> list[torch.nn.Module]:
    """Modules whose quant method multiplies with their own dense 2-D floating weight, once each
    (a tied LM head is the embedding module), skipping weights whose storage is in `exclude`."""
    out, seen = [], set()
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        # SGLang's dense methods, or a subclass of one (a packed layer's, cpu/packed_linear.py)
        dense = any(cls.__name__ in _DENSE_METHODS for cls in type(method).__mro__)
        if not dense or not isinstance(weight, torch.Tensor):
            continue
        if weight.dim() != 2 or weight.dtype not in _INT8_DTYPES or weight.device.type != "cpu":
            continue
        if weight.shape[1] % K_MULTIPLE:
            continue
        if id(module) in seen or storage_key(weight) in exclude:
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
    measured: bool = True, forced: str = INT8,
) -> Int8Summary:  # fmt: skip
    """Give every dense layer of `model` the int8 copies its weight shape's plan uses: for each
    row count up to the largest of `rows`, the kernel measured fastest (`kernel_plan`; `w8a8`
    only within W8A8_MAX_ERROR, `w8a8_errors`); a shape whose plan is dense throughout keeps
    only its own weights. Unmeasured (`measured=False`), every shape uses `forced` up to the
    largest of `rows` (`int8` up to INT8_FORCED_ROWS of them, dense above)."""
    layers = dense_layers(model, exclude)
    by_shape: dict[tuple[int, int], list[torch.nn.Module]] = {}
    for layer in layers:
        by_shape.setdefault(tuple(layer.weight.shape), []).append(layer)
    errors = w8a8_errors(by_shape, rows) if measured and w8a8_available() else {}
    plans = {
        shape: kernel_plan(group[0].weight, rows, sweeps, w8a8=errors.get(shape, 0.0) <= W8A8_MAX_ERROR)
        if measured else forced_plan(forced, max(rows))
        for shape, group in by_shape.items()
    }  # fmt: skip
    added, count = 0, 0
    for shape, group in by_shape.items():
        plan = plans[shape]
        if all(k == DENSE for k in plan):
            continue
        for layer in group:
            added += _add_copies(layer, plan)
            count += 1
    kernels = {f"{n}x{k}": plan_ranges(plans[(n, k)]) for n, k in by_shape}
    return Int8Summary(count, added / 2**20, kernels, {f"{n}x{k}": error for (n, k), error in errors.items()})


def w8a8_errors(
    by_shape: dict[tuple[int, int], list[torch.nn.Module]], rows: tuple[int, ...]
) -> dict[tuple[int, int], float]:  # fmt: skip
    """`w8a8_error` of each weight shape (on its first layer's weights), a warning for each
    beyond W8A8_MAX_ERROR, which its plan then leaves out."""
    errors = {shape: w8a8_error(strided(group[0].weight), rows) for shape, group in by_shape.items()}
    for (n, k), error in errors.items():
        if error > W8A8_MAX_ERROR:
            logger.warning(
                "SPECSOT draft %dx%d weights: no w8a8, its products were off by %.1f times what rounding "
                "the activations allows (fbgemm's kernel on this machine); int8 or dense instead", n, k, error,
            )  # fmt: skip
    return errors


def forced_plan(kernel: str, rows: int) -> tuple[str, ...]:
    """The unmeasured plan for row counts 1..rows: `kernel` throughout, `int8` only up to
    INT8_FORCED_ROWS and dense above."""
    forced = min(rows, INT8_FORCED_ROWS) if kernel == INT8 else rows
    return (kernel,) * forced + (DENSE,) * (rows - forced)


def _add_copies(layer: torch.nn.Module, plan: tuple[str, ...]) -> int:
    """Give `layer` the copies `plan` uses and the dispatching method; the bytes added."""
    added, weight = 0, strided(layer.weight)
    if INT8 in plan:
        q, s = quantize_rows(weight)
        layer.specsot_int8, layer.specsot_int8_scales = q, s
        added += q.numel() * q.element_size() + s.numel() * s.element_size()
    if W8A8 in plan:
        layer.specsot_w8a8 = pack_w8a8(weight)
        added += layer.weight.numel() + 4 * layer.weight.shape[0]  # int8 and a scale per row
    layer.specsot_int8_plan = plan
    layer.quant_method.__class__ = _int8_class(type(layer.quant_method))
    return added


@torch.inference_mode()
def kernel_plan(
    weight: torch.Tensor, rows: tuple[int, ...] = PROBE_ROWS, sweeps: int = 3, w8a8: bool = True
) -> tuple[str, ...]:  # fmt: skip
    """For each row count 1..max(rows), the kernel to multiply `weight` with: at a probed
    count the fastest of dense, `int8` and `w8a8` (best of `sweeps` sweeps after a warm-up;
    `w8a8` only if `w8a8` and where `W8A8_MARGIN` times as fast as `int8`), between probes the
    next probed count's."""
    loaded = strided(weight)  # a packed weight's row-major copy, made once
    q, s = quantize_rows(loaded)
    kernels = {DENSE: lambda x: linear(x, weight), INT8: lambda x: int8_linear(x, q, s, None)}
    if w8a8 and w8a8_available():
        packed = pack_w8a8(loaded)
        kernels[W8A8] = lambda x: w8a8_linear(x, packed, None)
    inputs = {n: torch.randn(n, weight.shape[1], dtype=weight.dtype) for n in rows}
    # Small matrices take tens of microseconds: time a few products per try so the timer's
    # own cost and one interruption do not decide; an LM head takes milliseconds and needs
    # no repeats.
    reps = 1 if weight.numel() > 2**25 else 5
    keys = [(k, n) for n in rows for k in kernels]
    best = best_of_sweeps(keys, lambda key: mean_ms(lambda: kernels[key[0]](inputs[key[1]]), reps), sweeps)
    return plan_from_times({n: {k: best[k, n] for k in kernels} for n in rows})


def plan_from_times(ms_by_rows: dict[int, dict[str, float]]) -> tuple[str, ...]:
    """The kernel by row count 1..max probed count from each probed count's times (kernel ->
    ms): the fastest, `w8a8` only where `W8A8_MARGIN` times as fast as `int8`'s, a tie with
    the weights as loaded going to them; a count between probes takes the next probed one's."""
    choice = {}
    for n, times in ms_by_rows.items():
        fast = min(times, key=times.get)
        if fast == W8A8 and INT8 in times and times[W8A8] > W8A8_MARGIN * times[INT8]:
            fast = INT8 if times[INT8] < times[DENSE] else DENSE
        if times[fast] >= times[DENSE]:
            fast = DENSE
        choice[n] = fast
    probed = sorted(choice)
    return tuple(choice[min(p for p in probed if p >= r)] for r in range(1, probed[-1] + 1))
