"""Stage `cost` of the device check (scripts/gpu_stages.py): a random Qwen2's forward time by
rows, plain decode against verify row groups, over a KV-cache prefix rewound between runs."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

from gpu_random_qwen2 import SMOKE_MODEL, Qwen2Shape, random_qwen2, stage_device
from gpu_record import Recorder, blocker


@dataclass(frozen=True)
class CostPlan:
    model: Qwen2Shape
    dtype: str = "bfloat16"
    prefix: int = 512  # tokens already in every request's KV cache
    rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    verify_tokens: int = 4  # a verify row group: this many draft tokens of one request
    warmup: int = 3
    iters: int = 10


DEVICE_COST = CostPlan(Qwen2Shape())
SMOKE_COST = CostPlan(SMOKE_MODEL, dtype="float32", prefix=16, rows=(1, 2, 4), verify_tokens=2, warmup=1, iters=2)


def _layout(kind: str, rows: int, plan: CostPlan) -> tuple[int, int]:
    """(requests, tokens per request) of `rows` forward rows: plain decode is one token per
    request; verify is `verify_tokens` per request (all rows of one request when fewer)."""
    if kind == "plain":
        return rows, 1
    k = min(plan.verify_tokens, rows)
    return rows // k, k


def _new_cache(model, max_len: int, kind: str):
    """A KV cache of `kind`: "static" is written in place, as SGLang's pool is; "dynamic" grows
    by concatenation (its copy is in the timed forward), for a transformers whose static cache
    cannot be rewound as `_rewind` does."""
    from transformers import DynamicCache, StaticCache

    return StaticCache(config=model.config, max_cache_len=max_len) if kind == "static" else DynamicCache()


def _rewind(cache, length: int) -> None:
    """Back to `length` cached tokens: the timed forward then sees the same prefix each time."""
    import torch

    current = int(cache.get_seq_length())
    if current != length:
        layers = list(getattr(cache, "layers", []))
        counters = [getattr(layer, "cumulative_length", None) for layer in layers]
        if layers and all(isinstance(c, torch.Tensor) for c in counters):
            for c in counters:
                c.fill_(length)
        else:
            cache.crop(length - current)  # a negative count removes that many tokens
    got = int(cache.get_seq_length())
    assert got == length, f"the KV cache holds {got} tokens after rewinding to {length}"


def _time_forward(model, ids, cache, plan: CostPlan, device) -> list[float]:
    """Milliseconds of each timed forward (CUDA events on a GPU, a wall clock on a CPU)."""
    import torch

    spans = []
    for i in range(plan.warmup + plan.iters):
        _rewind(cache, plan.prefix)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            end.record()
            spans.append((start, end))
        else:
            t0 = time.perf_counter()
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            spans.append((t0, time.perf_counter()))
    if device.type == "cuda":
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in spans[plan.warmup :]]
    return [(e - s) * 1e3 for s, e in spans[plan.warmup :]]


def measure_point(model, kind: str, rows: int, plan: CostPlan, device, cache_kind: str) -> dict:
    import torch

    requests, k = _layout(kind, rows, plan)
    cache = _new_cache(model, plan.prefix + k, cache_kind)
    prompt = torch.randint(0, model.config.vocab_size, (requests, plan.prefix), device=device)
    model.model(input_ids=prompt, past_key_values=cache, use_cache=True)  # the prefix, no logits
    ids = torch.randint(0, model.config.vocab_size, (requests, k), device=device)
    ms = _time_forward(model, ids, cache, plan, device)
    del cache
    return {"kind": kind, "rows": requests * k, "requests": requests, "tokens_per_request": k,
            "prefix": plan.prefix, "ms_median": round(statistics.median(ms), 4), "ms_min": round(min(ms), 4),
            "iters": len(ms), "cache": cache_kind}  # fmt: skip


def _cache_kind(rec: Recorder, model, plan: CostPlan, device) -> str:
    """"static" where this transformers' static cache can be rewound as `_rewind` does (tried on
    one row), else "dynamic"."""
    from dataclasses import replace

    try:
        measure_point(model, "plain", 1, replace(plan, warmup=0, iters=2), device, "static")
        return "static"
    except Exception as exc:
        why = blocker(exc)
        rec.emit(f"static KV cache unusable here, DynamicCache instead: {why}", static_cache_error=why)
        return "dynamic"


def stage_cost(rec: Recorder, plan: CostPlan) -> None:
    import torch

    device, dtype = stage_device(), getattr(torch, plan.dtype)
    model = random_qwen2(plan.model, dtype, device)
    params = sum(p.numel() for p in model.parameters())
    rec.emit(f"random Qwen2 ({params / 1e6:.1f} M parameters, {plan.dtype}) on {device}",
             model=asdict(plan.model), params=params, dtype=plan.dtype, device=str(device))  # fmt: skip
    errors = []
    with torch.inference_mode():
        cache_kind = _cache_kind(rec, model, plan, device)
        for rows in plan.rows:
            for kind in ("plain", "verify"):
                try:
                    point = measure_point(model, kind, rows, plan, device, cache_kind)
                except Exception as exc:  # one shape failing (memory, an API) leaves the others
                    errors.append(blocker(exc))
                    rec.emit(f"{kind} rows={rows}: {errors[-1]}", kind=kind, rows=rows, error=errors[-1])
                    continue
                rec.emit(f"{kind:6} rows={point['rows']:>4} ({point['requests']} x {point['tokens_per_request']}) "
                         f"{point['ms_median']:.3f} ms", **point)  # fmt: skip
    rec.finish("ok" if not errors else "failed", errors[0] if errors else None)
