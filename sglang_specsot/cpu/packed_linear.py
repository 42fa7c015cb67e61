"""oneDNN's packed weight layout for SGLang's unquantized linear layers on CPU, where faster.

A decode step on a CPU is bound by reading the weights. torch's bf16 `F.linear` on a CPU with
native bf16 (AVX-512 bf16, AMX) goes to oneDNN with the weight in its loaded row-major layout,
which oneDNN's bf16 kernels do not read at memory speed: on the 2-core AVX-512 EPYC the
Qwen2.5-1.5B MLP's 8960x1536 product took 1.4 ms at 1 row, 1.7 ms at 16, against 0.75 and 1.1
ms with the weight in oneDNN's own blocked layout, out of cache (docs/benchmarks.md). SGLang
lays weights out this way itself where sgl-kernel's CPU build and AMX are present
(`_amx_process_weight_after_loading`, layers/quantization/unquant.py:569); elsewhere it
multiplies the loaded layout. Here torch's own oneDNN ops do the same
(`mkldnn._reorder_linear_weight` once after loading, `mkldnn._linear_pointwise` per product:
what torch.compile's CPU backend packs linear weights with).

Invariant: a layer is packed only where, for its weight's shape and dtype, a start-up timing
measured the packed product no slower than the loaded layout's at every probed row count
(one decode row to a prefill chunk) and faster over them all; the packed weight replaces the
loaded one (no second copy) and gives the same products. Only bf16: the dtype whose loaded
layout is slow; float32 parity runs keep torch's own path.

A packed weight is an opaque oneDNN tensor: no `data_ptr`, and `F.linear` cannot read it. Code
that multiplies or quantizes a layer's weight itself uses `linear` and `strided` here; code that
keys weights by storage uses `storage_key`. Reloading weights into a running server
(`/update_weights_from_disk`) writes into the loaded layout: set the mode to "off" for that.
"""

from __future__ import annotations

import functools
import logging
import os

import torch

from sglang_specsot.costs.probe import best_of_sweeps, mean_ms

logger = logging.getLogger(__name__)

# In the server's environment: "auto" (the default) packs where measured faster, "off" never,
# "on" every eligible layer, unmeasured (tests that must reach the packed path).
PACKED_LINEAR_ENV = "SGLANG_SPECSOT_PACKED_LINEAR"
MODES = ("auto", "off", "on")
PACKED_DTYPES = (torch.bfloat16,)
# A decode row, a SoT branch batch, verify windows, and a prefill chunk's rows.
PROBE_ROWS = (1, 4, 16, 64, 256)
# Packed is taken only where no probed count is slower than this share of the loaded layout's
# time: a probe's noise must not swap a kernel that is equal for one that is worse.
SLACK = 1.02


def packed_mode() -> str:
    """The mode from the environment, checked."""
    mode = os.environ.get(PACKED_LINEAR_ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{PACKED_LINEAR_ENV}={mode!r} is not a mode; set it to one of {', '.join(MODES)}")
    return mode


@functools.cache
def available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether this torch and CPU can pack and multiply a `dtype` weight with oneDNN: its bf16
    kernels need AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT, and refuse on an AVX2-only CPU or where
    ONEDNN_MAX_CPU_ISA caps oneDNN below them."""
    ops = torch.ops.mkldnn
    if not torch.backends.mkldnn.is_available() or not all(
        hasattr(ops, name) for name in ("_reorder_linear_weight", "_linear_pointwise")
    ):
        return False
    try:
        weight = torch.ones(8, 16, dtype=dtype)
        out = linear(torch.ones(2, 16, dtype=dtype), pack(weight))
    except RuntimeError as exc:  # "bf16 path needs the cpu support ...": no packed path here
        logger.info("sglang-specsot: no oneDNN packed %s linear on this CPU (%s)", dtype, str(exc).splitlines()[0])
        return False
    return bool(torch.equal(out, torch.full_like(out, 16)))


def is_packed(weight) -> bool:
    """Whether `weight` is in oneDNN's packed layout."""
    return isinstance(weight, torch.Tensor) and weight.is_mkldnn


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (out x in, row-major) in oneDNN's layout for products of any row count."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 1)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for a weight in either layout."""
    if is_packed(weight):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return torch.nn.functional.linear(x, weight, bias)


def strided(weight: torch.Tensor) -> torch.Tensor:
    """The weight in the loaded row-major layout (a copy where it is packed)."""
    return weight.to_dense() if is_packed(weight) else weight


def eligible(layer) -> bool:
    """A CPU layer with a dense 2-D weight of a packed dtype in the loaded layout."""
    w = getattr(layer, "weight", None)
    return (
        isinstance(w, torch.Tensor) and w.device.type == "cpu" and w.dim() == 2
        and w.layout == torch.strided and w.dtype in PACKED_DTYPES
    )  # fmt: skip


@functools.lru_cache(maxsize=64)
def packs_faster(out_features: int, in_features: int, dtype: torch.dtype, sweeps: int = 3) -> bool:
    """Whether the packed product of an `out_features` x `in_features` weight of `dtype` is
    measured faster (the module's invariant), on a random weight of that shape: its cost
    depends on the shape, not the values. Once per shape and process."""
    weight = torch.randn(out_features, in_features, dtype=dtype)
    packed = pack(weight)
    kernels = {"loaded": weight, "packed": packed}
    inputs = {n: torch.randn(n, in_features, dtype=dtype) for n in PROBE_ROWS}
    reps = 1 if weight.numel() > 2**25 else 5
    keys = [(k, n) for n in PROBE_ROWS for k in kernels]
    with torch.inference_mode():
        best = best_of_sweeps(keys, lambda key: mean_ms(lambda: linear(inputs[key[1]], kernels[key[0]]), reps), sweeps)
    return choose_packed({n: (best["loaded", n], best["packed", n]) for n in PROBE_ROWS})


def choose_packed(ms_by_rows: dict[int, tuple[float, float]]) -> bool:
    """From (loaded, packed) milliseconds by row count: packed where no count is slower than
    SLACK times the loaded layout's and all of them together are faster."""
    loaded = sum(t for t, _ in ms_by_rows.values())
    packed = sum(t for _, t in ms_by_rows.values())
    return packed < loaded and all(p <= SLACK * t for t, p in ms_by_rows.values())


_SUBCLASSES: dict[type, type] = {}


def _packed_class(cls: type) -> type:
    """`cls` with an `apply` that multiplies a packed layer's weight with oneDNN's packed op
    and leaves any other layer to `cls.apply`. Single inheritance and no new slots, so an
    object's class can switch in place (cpu/draft_int8.py does the same and may wrap this)."""
    if cls not in _SUBCLASSES:

        def apply(self, layer, x, bias=None):
            if is_packed(layer.weight):
                return linear(x, layer.weight, bias)
            return cls.apply(self, layer, x, bias)

        def apply_into(self, layer, x, output, bias=None):  # SGLang's caller-owned output (linear.py:1790)
            if is_packed(layer.weight):
                return output.copy_(linear(x, layer.weight, bias))
            return cls.apply_into(self, layer, x, output, bias)

        name = f"Packed{cls.__name__}"
        methods = {"apply": apply} | ({"apply_into": apply_into} if hasattr(cls, "apply_into") else {})
        _SUBCLASSES[cls] = type(name, (cls,), {"__module__": __name__, "__qualname__": name, "__slots__": (), **methods})
    return _SUBCLASSES[cls]


def pack_layer(layer) -> None:
    """Replace `layer`'s weight with its packed layout and switch its method to `_packed_class`."""
    old = layer.weight
    layer.weight = torch.nn.Parameter(pack(old.data), requires_grad=False)
    for name, value in vars(old).items():  # SGLang's weight attributes (input_dim, weight_loader, ...)
        setattr(layer.weight, name, value)
    layer.quant_method.__class__ = _packed_class(type(layer.quant_method))


def maybe_pack(layer, mode: str | None = None) -> bool:
    """Pack `layer` if eligible and, in mode "auto", measured faster for its shape; whether it was."""
    mode = mode or packed_mode()
    if mode == "off" or not eligible(layer) or not available(layer.weight.dtype):
        return False
    if "apply" in getattr(layer.quant_method, "__dict__", {}):
        return False  # wrapped per instance (SGLang's kernel API logging): a class switch would not show
    n, k = layer.weight.shape
    if mode == "auto" and not packs_faster(n, k, layer.weight.dtype):
        return False
    pack_layer(layer)
    return True


def pack_after_loading(result, method, layer):
    """AFTER hook on UnquantizedLinearMethod.process_weights_after_loading (host change
    cpu-packed-linear-weights): pack the layer where measured faster, once its weights are in."""
    if maybe_pack(layer):
        _log_shape(tuple(layer.weight.shape), layer.weight.dtype)
    return result


@functools.cache
def _log_shape(shape: tuple[int, int], dtype: torch.dtype) -> None:
    logger.info("sglang-specsot: %dx%d %s linear weights in oneDNN's packed layout, measured faster (%s=off keeps "
                "them as loaded)", *shape, str(dtype).removeprefix("torch."), PACKED_LINEAR_ENV)  # fmt: skip
