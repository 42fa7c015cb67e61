"""Which floating dtype runs this model's forward faster on this CPU: the checkpoint's
half-precision dtype or float32.

SGLang's `--dtype auto` takes the checkpoint's dtype (bf16 for most chat models) whatever the
CPU. Where the CPU has native bf16 (avx512_bf16, AMX) a bf16 product reads half the bytes and
is the faster one; where it has not (AVX2 only), oneDNN converts the operands and a bf16
product can cost more than a float32 one. A forward's time grows with its matrix products, so
the choice times one of them, the MLP's up-projection (hidden x intermediate), in each dtype at
the row counts a server runs (1 row: decoding one answer; 8: a SoT batch), and keeps the half
dtype unless float32 is faster by `MARGIN` and its weights, twice the size, fit in memory.

Torch only; the server-side provider that applies the choice is `cpu/dtype.py`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

HALF = ("bfloat16", "float16")
FLOAT32 = "float32"
ROWS = (1, 8)
# float32 doubles the weights' memory and halves what fits in the KV cache: it has to win by
# more than timing noise (a few percent on these machines) to be chosen.
MARGIN = 0.85
# float32 weights may take at most this share of the memory available at start-up; the rest is
# for the KV cache, activations and the draft model's cache.
MEMORY_SHARE = 0.5
SWEEPS = 5
# How the choice's log line begins, so that a launcher can show it to its user.
LOG_MARKER = "--dtype auto on CPU:"


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    """The dtype chosen, the checkpoint's half dtype it was weighed against, and why."""

    dtype: str
    half: str
    ms: Mapping[str, float]  # each dtype's time for the timed product, summed over ROWS
    reason: str

    @property
    def changed(self) -> bool:
        """Whether the choice differs from what SGLang's `auto` would run (the half dtype)."""
        return self.dtype != self.half

    def message(self) -> str:
        timed = ", ".join(f"{dtype} {ms:.2f} ms" for dtype, ms in self.ms.items())
        return (
            f"{LOG_MARKER} running {self.dtype} ({self.reason}; the MLP product for "
            f"{' + '.join(map(str, ROWS))} rows: {timed}); pass --dtype to choose yourself"
        )


def half_dtype(checkpoint_dtype: str | None) -> str:
    """The half-precision dtype SGLang's `auto` runs a checkpoint in on CPU: its own when it is
    one, else bfloat16."""
    return checkpoint_dtype if checkpoint_dtype in HALF else "bfloat16"


def choose_dtype(
    half: str, ms: Mapping[str, float], fp32_weight_bytes: int | None, available_bytes: int | None
) -> DtypeChoice:
    """float32 where it timed at most MARGIN of `half` and its weights fit; `half` otherwise.

    `ms` maps each dtype to its timed product (ms); None for a size means it is unknown, and an
    unknown size never risks float32."""
    if half not in HALF:
        raise ValueError(f"half dtype {half!r} is not one of {HALF}")
    missing = {half, FLOAT32} - set(ms)
    if missing:
        raise ValueError(f"no timing for {sorted(missing)}; time both {half} and {FLOAT32}")
    ratio = ms[FLOAT32] / ms[half] if ms[half] > 0 else float("inf")
    if ratio > MARGIN:
        return DtypeChoice(half, half, dict(ms), f"float32 not faster by {1 - MARGIN:.0%} ({ratio:.2f}x {half}'s time)")
    if fp32_weight_bytes is None or available_bytes is None:
        return DtypeChoice(half, half, dict(ms), f"float32 faster ({ratio:.2f}x) but the weights' size or free memory is unknown")
    limit = int(available_bytes * MEMORY_SHARE)
    if fp32_weight_bytes > limit:
        return DtypeChoice(
            half, half, dict(ms),
            f"float32 faster ({ratio:.2f}x) but its weights ({fp32_weight_bytes / 2**30:.1f} GiB) exceed "
            f"{MEMORY_SHARE:.0%} of the available memory ({available_bytes / 2**30:.1f} GiB)",
        )  # fmt: skip
    return DtypeChoice(FLOAT32, half, dict(ms), f"float32 faster: {ratio:.2f}x {half}'s time")


def time_dtypes(hidden: int, intermediate: int, half: str, sweeps: int = SWEEPS) -> dict[str, float]:
    """The MLP up-projection's product in `half` and in float32, each dtype's time summed over
    ROWS: every (dtype, rows) product timed once per sweep, the least of `sweeps` sweeps after a
    warm-up sweep, as the start-up probe times its products (`probe.best_of_sweeps`)."""
    import torch

    from sglang_specsot.costs.probe import best_of_sweeps

    weight = torch.randn(intermediate, hidden)
    weights = {half: weight.to(getattr(torch, half)), FLOAT32: weight}
    inputs = {(d, n): torch.randn(n, hidden).to(w.dtype) for d, w in weights.items() for n in ROWS}

    def time_ms(key: tuple[str, int]) -> float:
        start = time.perf_counter()
        torch.nn.functional.linear(inputs[key], weights[key[0]])
        return (time.perf_counter() - start) * 1e3

    best = best_of_sweeps(list(inputs), time_ms, sweeps)
    return {d: sum(best[d, n] for n in ROWS) for d in weights}
