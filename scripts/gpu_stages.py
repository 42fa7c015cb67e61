"""The stages of the device check (scripts/gpu_check.py), one process each:

    python3 scripts/gpu_stages.py {cost,masks,parity,tree,vocab} --out FILE.jsonl [--smoke] [--limit S]

(tree and vocab, and the parity stage's sync counts, are in gpu_stages_cuda_path.py.)

Each appends JSON lines to FILE as results come, prints a line per result, and ends with one
line carrying `status` (ok, failed, blocked) and, when not ok, `blocker`: the exact exception
that stopped it. `--smoke` runs the same code in small shapes on the CPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_stages_cuda_path, gpu_sync_count


class Recorder:
    """Appends one JSON line per result to the run's file and prints a human line beside it."""

    def __init__(self, out: Path, stage: str) -> None:
        self.out, self.stage, self.started = out, stage, time.monotonic()

    def emit(self, line: str, **record) -> None:
        with open(self.out, "a", encoding="utf-8") as f:
            f.write(json.dumps({"stage": self.stage, **record}) + "\n")
        print(f"[{self.stage}] {line}", flush=True)

    def finish(self, status: str, blocker: str | None = None, detail: str = "", **record) -> None:
        seconds = round(time.monotonic() - self.started, 1)
        said = f": {blocker}" if blocker else (f": {detail}" if detail else "")
        self.emit(f"{status} in {seconds} s{said}", status=status, blocker=blocker, seconds=seconds, **record)


def _blocker(exc: BaseException) -> str:
    """The exception and the innermost frames, as short as still tells where."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames))
    return f"{type(exc).__name__}: {exc} (at {where})"[:1500]


def _device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# --- a random-weight Qwen2 ---------------------------------------------------------------------


@dataclass(frozen=True)
class Qwen2Shape:
    """A Qwen2 architecture; the defaults are Qwen2.5-1.5B's."""

    hidden: int = 1536
    layers: int = 28
    heads: int = 12
    kv_heads: int = 2
    intermediate: int = 8960
    vocab: int = 151936
    init_std: float = 0.02


# std 0.2: at 0.02 this small model answers every prompt with one token repeated, and a draft
# that read the wrong row or slot would still propose that token.
SMOKE_MODEL = Qwen2Shape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512, init_std=0.2)


def random_qwen2(shape: Qwen2Shape, dtype, device, seed: int = 0):
    """transformers' Qwen2ForCausalLM with random weights, built on `device` (no download)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, initializer_range=shape.init_std,
        attn_implementation="sdpa", architectures=["Qwen2ForCausalLM"], bos_token_id=0, eos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in `dtype` directly: no float32 copy of 1.5B weights
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


# --- stage a: forward cost by rows ------------------------------------------------------------


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
        blocker = _blocker(exc)
        rec.emit(f"static KV cache unusable here, DynamicCache instead: {blocker}", static_cache_error=blocker)
        return "dynamic"


def stage_cost(rec: Recorder, plan: CostPlan) -> None:
    import torch

    device, dtype = _device(), getattr(torch, plan.dtype)
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
                    errors.append(_blocker(exc))
                    rec.emit(f"{kind} rows={rows}: {errors[-1]}", kind=kind, rows=rows, error=errors[-1])
                    continue
                rec.emit(f"{kind:6} rows={point['rows']:>4} ({point['requests']} x {point['tokens_per_request']}) "
                         f"{point['ms_median']:.3f} ms", **point)  # fmt: skip
    rec.finish("ok" if not errors else "failed", errors[0] if errors else None)


# --- stage b: tree masks through SGLang's Triton extend kernel ---------------------------------


@dataclass(frozen=True)
class MaskPlan:
    heads: int = 12
    kv_heads: int = 2
    head_dim: int = 128
    n: int = 8  # draft tokens per request
    prefix_lens: tuple[int, ...] = (5, 37, 130)
    dtype: str = "bfloat16"
    tol: float = 2e-2  # max |kernel - float64 reference| allowed for this dtype


DEVICE_MASKS = MaskPlan()
SMOKE_MASKS = MaskPlan(heads=2, kv_heads=1, head_dim=16, prefix_lens=(3, 9), dtype="float32", tol=1e-4)


def _trees(n: int):
    """A branching tree, a padded small tree and a chain, each of `n` nodes (the branching
    one first, so it gets the shortest prefix, where a wrong mask shows most)."""
    from sglang_specsot.speculative.draft_tree import DraftTree, pad_tree

    assert n == 8, f"the check's trees have 8 nodes, got n={n}"
    chain = DraftTree(tuple(range(10, 18)), (-1, 0, 1, 2, 3, 4, 5, 6))
    branching = DraftTree(tuple(range(20, 28)), (-1, 0, 0, 1, 1, 2, 3, 5))
    small = pad_tree(DraftTree((30, 31, 32), (-1, 0, 0)), n, filler=0)
    return branching, small, chain


def qlen_mask_of(trees, n: int):
    """The worker's QLEN_ONLY mask: `tree_mask` rows of each request, flattened."""
    import torch

    from sglang_specsot.speculative.draft_tree import tree_mask

    return torch.tensor([tree_mask(t, n) for t in trees], dtype=torch.bool).flatten()


def _reference_attention(q, k, v, visible, scale):
    """float64 attention of q (n, H, D) over k, v (L, KH, D) where `visible` (n, L) allows."""
    import torch

    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@dataclass(frozen=True)
class MaskCase:
    """One verify window of `bs` requests laid out as SGLang's Triton backend hands it over."""

    q: object  # (bs * n, heads, head_dim)
    k: object  # (bs * n, kv_heads, head_dim): the window's keys
    v: object  # (bs * n, kv_heads, head_dim)
    k_buf: object  # (pool, kv_heads, head_dim): the KV pool the prefixes live in
    v_buf: object
    kv_indices: object  # (sum(prefix_lens),) int64: each request's prefix slots, in order
    kv_indptr: object  # (bs + 1,) int32
    qlen: object  # (bs * n * n,) bool: the worker's QLEN_ONLY tree mask


def mask_case(plan: MaskPlan, device) -> MaskCase:
    import torch

    n, bs, total = plan.n, len(plan.prefix_lens), sum(plan.prefix_lens)
    trees = [_trees(n)[i % 3] for i in range(bs)]
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(rows: int, heads: int):
        values = torch.randn(rows, heads, plan.head_dim, generator=g)
        return values.to(device=device, dtype=getattr(torch, plan.dtype))

    pool = total + 7  # prefix slots scattered through a pool, as the allocator leaves them
    return MaskCase(
        q=rand(bs * n, plan.heads), k=rand(bs * n, plan.kv_heads), v=rand(bs * n, plan.kv_heads),
        k_buf=rand(pool, plan.kv_heads), v_buf=rand(pool, plan.kv_heads),
        kv_indices=torch.randperm(pool, generator=g)[:total].to(device),
        kv_indptr=torch.tensor([0, *itertools.accumulate(plan.prefix_lens)], dtype=torch.int32, device=device),
        qlen=qlen_mask_of(trees, n).to(device),
    )  # fmt: skip


def kernel_output(case: MaskCase, plan: MaskPlan):
    """SGLang's Triton extend kernel over the case, reading our FULL-layout mask (tree_masks.py)."""
    import torch

    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    from sglang_specsot.speculative.tree_masks import full_layout_indptr, full_layout_mask

    n, bs = plan.n, len(plan.prefix_lens)
    prefix = torch.tensor(plan.prefix_lens, device=case.q.device)
    mask = full_layout_mask(case.qlen, prefix, n, sum(plan.prefix_lens))
    qo_indptr = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=case.q.device)
    o = torch.empty_like(case.q)
    extend_attention_fwd(case.q, case.k, case.v, o, case.k_buf, case.v_buf, qo_indptr, case.kv_indptr,
                         case.kv_indices, mask, True, full_layout_indptr(prefix, n), n, 1.0, 1.0,
                         sm_scale=plan.head_dim**-0.5)  # fmt: skip
    return o


def reference_errors(case: MaskCase, plan: MaskPlan, o) -> tuple[float, float]:
    """(max |o - tree reference|, max |causal reference - tree reference|) over the requests."""
    import torch

    n, bs, scale = plan.n, len(plan.prefix_lens), plan.head_dim**-0.5
    worst = teeth = 0.0
    for b, p in enumerate(plan.prefix_lens):
        rows = slice(b * n, (b + 1) * n)
        slots = case.kv_indices[case.kv_indptr[b] : case.kv_indptr[b + 1]]
        k, v = torch.cat([case.k_buf[slots], case.k[rows]]), torch.cat([case.v_buf[slots], case.v[rows]])
        prefix = torch.ones(n, p, dtype=torch.bool, device=o.device)
        tree = torch.cat([prefix, case.qlen.view(bs, n, n)[b]], 1)
        causal = torch.cat([prefix, torch.ones(n, n, dtype=torch.bool, device=o.device).tril()], 1)
        ref = _reference_attention(case.q[rows], k, v, tree, scale)
        worst = max(worst, (o[rows].double() - ref).abs().max().item())
        teeth = max(teeth, (_reference_attention(case.q[rows], k, v, causal, scale) - ref).abs().max().item())
    return worst, teeth


def stage_masks(rec: Recorder, plan: MaskPlan) -> None:
    device = _device()
    case = mask_case(plan, device)
    worst, teeth = reference_errors(case, plan, kernel_output(case, plan))
    # The causal reference differs from the tree one by `teeth`: the kernel must be far closer
    # to the tree's, or the check could not tell a tree mask from a causal one.
    ok = worst <= plan.tol and teeth > 4 * worst
    said = f"max |kernel - reference| {worst:.3g} (tol {plan.tol}), tree vs causal reference {teeth:.3g}"
    rec.finish("ok" if ok else "failed", None if ok else said, said, max_abs_err=worst, tol=plan.tol,
               tree_vs_causal=teeth, prefix_lens=list(plan.prefix_lens), n=plan.n, dtype=plan.dtype,
               device=str(device))  # fmt: skip


# --- stage c: SPECSOT vs plain through sglang.Engine -------------------------------------------


@dataclass(frozen=True)
class ParityPlan:
    model: Qwen2Shape
    dtype: str = "float32"  # token identity is exact in float32; bf16 may differ by rounding
    prompts: int = 4
    prompt_len: int = 48
    max_new: int = 32
    draft_tokens: int = 6


# Qwen2.5-1.5B's widths and vocabulary, 4 of its 28 layers (parity does not depend on depth, the
# save and load time does). std 0.1 gives wide argmax margins; 0.02 gives near-ties.
DEVICE_PARITY = ParityPlan(Qwen2Shape(layers=4, init_std=0.1))
SMOKE_PARITY = ParityPlan(SMOKE_MODEL, prompts=2, prompt_len=12, max_new=32)

# The target as its own draft: SGLang's standalone draft reads its input one token ahead
# (eagle_worker_v2.py `_draft_extend_for_prefill`: position p holds token p + 1), so it never
# sees a prompt's first token. A real model hardly cares (Qwen2.5-0.5B drafting for itself in
# float32 accepts 21 of 22 depth-2 drafts), but a random one's next token often hinges on it:
# the target drafting for itself is then accepted where its argmax without the first token is
# its argmax with it (`first_token_agreement`), and the check expects that share, less this.
SELF_DRAFT_TOLERANCE = 0.15


def save_random_qwen2(plan: ParityPlan, out: Path, device) -> Path:
    """The random model as a local HF checkpoint (config + safetensors); no tokenizer: the
    engines take token ids and run with skip_tokenizer_init."""
    import torch

    model = random_qwen2(plan.model, getattr(torch, plan.dtype), device)
    model.save_pretrained(out)
    return out


def first_token_agreement(model, prompts: list[list[int]], outputs: list[list[int]]) -> tuple[int, int]:
    """(agreeing, positions): along each of plain's answers, the positions where `model`'s
    argmax without the prompt's first token (the context a standalone draft sees, shifted to
    start at position 0) is its argmax with it: the share of a self-draft's drafts the target
    can accept, at any depth."""
    import torch

    device = next(model.parameters()).device
    agreeing = positions = 0
    with torch.no_grad():
        for prompt, output in zip(prompts, outputs):
            if not output:
                continue
            seq = torch.tensor([prompt + output[:-1]], device=device)  # the contexts of every answer token
            full = model(seq).logits[0, len(prompt) - 1 :].argmax(-1)
            shifted = seq[:, 1:]
            ahead = model(shifted, position_ids=torch.arange(shifted.shape[1], device=device)[None]).logits
            agreeing += int((ahead[0, len(prompt) - 2 :].argmax(-1) == full).sum())
            positions += len(output)
    return agreeing, positions


def self_draft_shortfall(acceptance_by_depth: dict | None, expected: float) -> str | None:
    """Why a self-draft run's pooled acceptance (accepted over reached, every depth) falls
    short of `expected` by more than SELF_DRAFT_TOLERANCE, or None."""
    sources = (acceptance_by_depth or {}).values()
    reached = sum(sum(c.get("reached", [])) for c in sources)
    accepted = sum(sum(c.get("accepted", [])) for c in sources)
    if reached == 0:
        return "it never drafted"
    if accepted / reached < expected - SELF_DRAFT_TOLERANCE:
        return f"{accepted} of {reached} drafts accepted ({accepted / reached:.2f}), where the model's first-token agreement is {expected:.2f}"
    return None


def parity_prompts(plan: ParityPlan) -> list[list[int]]:
    """Token-id prompts, each a random phrase repeated: context drafting finds its next tokens."""
    import random

    rng = random.Random(0)
    prompts = []
    for i in range(plan.prompts):
        phrase = [rng.randrange(2, plan.model.vocab) for _ in range(5 + 3 * i)]
        prompts.append((phrase * plan.prompt_len)[: plan.prompt_len])
    return prompts


def engines_on_cpu() -> bool:
    """Whether the parity stage's engines run on SPECSOT's CPU runtime (gpu_check.py sets this
    for `cpu-smoke` with SPECSOT_GPU_SMOKE_ENGINES=1) rather than SGLang's CUDA path."""
    return os.environ.get("SGLANG_USE_CPU_ENGINE") == "1"


def _engine_kwargs(plan: ParityPlan, on_cpu: bool) -> dict:
    """sglang.Engine's arguments: the CUDA path (Triton attention, decode graphs), or on the
    CPU (SPECSOT's CPU runtime) to try the stage's own logic here before a device call."""
    if on_cpu:
        return dict(device="cpu", attention_backend="specsot_cpu", max_total_tokens=4096)
    return dict(
        attention_backend="triton", mem_fraction_static=0.3, cuda_graph_max_bs_decode=plan.prompts,
        # SGLang's breakable prefill graphs hold captured tensors through sgl_kernel.weak_ref_tensor,
        # a C++ op with no torch equivalent; parity is about the decode and verify graphs.
        disable_prefill_cuda_graph=True,
    )  # fmt: skip


def _engine_outputs(model_dir: Path, plan: ParityPlan, prompts, extra: dict) -> tuple[list[dict], dict]:
    """The engine's greedy outputs, the decode's wall time and, for SPECSOT, how its verify
    steps ran (`/server_info`'s verify_graphs: replayed or eager, by width)."""
    import sglang

    engine = sglang.Engine(
        model_path=str(model_dir), dtype=plan.dtype, sampling_backend="pytorch",
        random_seed=0, log_level="info",  # info: a timed-out stage's stderr tail says how far start-up got
        **{"skip_tokenizer_init": True, **_engine_kwargs(plan, engines_on_cpu()), **extra},  # extra may override
    )  # fmt: skip
    try:
        params = {"temperature": 0.0, "max_new_tokens": plan.max_new, "ignore_eos": True}
        # The first call compiles Triton's kernels for the shapes it meets (a verify width met for
        # the first time costs a compile); the second, on a flushed cache, is the one timed.
        times, runs = [], []
        for _ in range(2):
            engine.flush_cache()
            started = time.monotonic()
            runs.append(engine.generate(input_ids=prompts, sampling_params=params))
            times.append(round(time.monotonic() - started, 3))
        outputs = runs[-1]
        repeat_differs = [i for i, (a, b) in enumerate(zip(*runs)) if a["output_ids"] != b["output_ids"]]
        states = engine.get_server_info().get("internal_states") or [{}]
        specsot = states[0].get("specsot") or {}
        # Acceptance by chain depth tells a wrong draft-extend (depth 1 low) from a wrong draft
        # step (depth 1 right, deeper ones low).
        return outputs, {"decode_s": times[-1], "first_call_s": times[0], "repeat_differs": repeat_differs,
                         "verify_graphs": specsot.get("verify_graphs"),
                         "acceptance_by_depth": specsot.get("acceptance_by_depth")}  # fmt: skip
    finally:
        engine.shutdown()


def _import_sglang(rec: Recorder) -> None:
    import sglang
    import sglang.srt.entrypoints.engine  # noqa: F401  the scheduler's and model runner's imports

    kernel = sys.modules.get("sgl_kernel")
    origin = getattr(kernel, "__file__", None) if kernel else None
    rec.emit(f"sglang {sglang.__version__} imports (sgl_kernel: {origin or 'not imported'})",
             sglang=sglang.__version__, sgl_kernel=origin)  # fmt: skip


def stage_parity(rec: Recorder, plan: ParityPlan, smoke: bool) -> None:
    import gpu_stages_cuda_path as cuda_path  # the `syncs` record of the SPECSOT engines

    try:
        _import_sglang(rec)
    except Exception as exc:
        rec.finish("blocked", f"importing SGLang: {_blocker(exc)}")
        return
    with tempfile.TemporaryDirectory(prefix="specsot-parity-") as tmp:
        model_dir = save_random_qwen2(plan, Path(tmp) / "qwen2-random", _device())
        rec.emit(f"random Qwen2 saved ({sum(f.stat().st_size for f in model_dir.iterdir()) / 2**20:.0f} MiB)",
                 model=asdict(plan.model), dtype=plan.dtype)  # fmt: skip
        if smoke and not engines_on_cpu():
            rec.finish("ok", None, "smoke: the engines are not started (SPECSOT_GPU_SMOKE_ENGINES=1 starts them on the CPU)", smoke=True)  # fmt: skip
            cuda_path.record_syncs_smoke(rec.out)  # the sync counter's code, on a stand-in worker
            return
        prompts = parity_prompts(plan)
        trace = Path(tmp) / "plugin-trace.jsonl"
        # Verify on every step (not only where SPECSOT's costs say it pays), and a line per
        # process that loaded the plugin.
        os.environ.update(SGLANG_SPECSOT_TRACE_FILE=str(trace), SGLANG_SPECSOT_FIXED_WINDOW="1")
        plain = _run_engine(rec, "plain", model_dir, plan, prompts, {})  # with SGLang's decode graphs
        if plain is None:
            return
        spec = {"speculative_algorithm": "SPECSOT", "speculative_num_draft_tokens": plan.draft_tokens}
        # The target as its own draft model: every step verifies a full window, accepted as far
        # as the drafts survive the first token a standalone draft never sees (first_token_agreement).
        self_draft = spec | {"speculative_draft_model_path": str(model_dir)}
        runs, sync_logs = {}, {}  # each SPECSOT engine's blocking syncs, step by step (the `syncs` record)
        eager = {"disable_cuda_graph": True}
        for name, extra in (("SPECSOT graphs", spec), ("SPECSOT eager", spec | eager),
                            ("SPECSOT self-draft graphs", self_draft), ("SPECSOT self-draft eager", self_draft | eager)):  # fmt: skip
            sync_logs[name], sync_env = cuda_path.sync_log_env(Path(tmp), name)
            os.environ.update(sync_env)
            runs[name] = _run_engine(rec, name, model_dir, plan, prompts, extra, finish=False)
        cuda_path.record_syncs(rec.out, sync_logs)
        plugin = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
        agreement = _self_draft_expectation(model_dir, plan, prompts, plain[0])
        rec.emit(f"first-token agreement along plain's answers: {agreement['agreeing']} of {agreement['positions']}",
                 self_draft_expected=agreement)  # fmt: skip
    blocked = [name for name, run in runs.items() if run is None]
    results = {name: _compared(plain, run) for name, run in runs.items() if run is not None}
    bad = {name: r["mismatched_prompts"] for name, r in results.items() if r["mismatched_prompts"]}
    unreplayed = [name for name, r in results.items()
                  if "graphs" in name and not smoke and not (r["verify_graphs"] or {}).get("replayed_by_width")]  # fmt: skip
    problem = f"SPECSOT differs from plain on prompts {bad}" if bad else None
    unstable = {name: run[1]["repeat_differs"] for name, run in [("plain", plain), *runs.items()] if run and run[1]["repeat_differs"]}
    if problem is None and unstable:
        problem = f"a second call answered differently on prompts {unstable}"
    if problem is None and blocked:
        problem = f"engines that did not run: {blocked}"
    if problem is None and unreplayed:
        problem = f"SPECSOT's verify graphs never replayed in {unreplayed}"
    short = {name: why for name, r in results.items() if "self-draft" in name
             and (why := self_draft_shortfall(r["acceptance_by_depth"], agreement["share"]))}  # fmt: skip
    if problem is None and short:
        problem = f"the target drafting for itself: {short}: its drafts differ from the model that made them"
    rec.finish("ok" if problem is None else "failed", problem, prompts=len(prompts), max_new=plan.max_new,
               plain_decode_s=plain[1]["decode_s"], runs=results, self_draft_expected=agreement,
               plugin_processes=[{k: p.get(k) for k in ("caller", "error")} for p in plugin])  # fmt: skip


def _self_draft_expectation(model_dir: Path, plan: ParityPlan, prompts, plain_outputs) -> dict:
    """`first_token_agreement` of the saved model along plain's answers, on this device."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, plan.dtype)).to(_device()).eval()
    agreeing, positions = first_token_agreement(model, prompts, [o["output_ids"] for o in plain_outputs])
    return {"agreeing": agreeing, "positions": positions, "share": round(agreeing / max(positions, 1), 4)}


def _compared(plain, run) -> dict:
    """A SPECSOT run against plain's: mismatched prompts, accept lengths, time, graph replays."""
    (plain_out, plain_info), (out, info) = plain, run
    return {
        "mismatched_prompts": [i for i, (a, b) in enumerate(zip(plain_out, out)) if a["output_ids"] != b["output_ids"]],
        "accept_length": [r["meta_info"].get("spec_accept_length") for r in out],
        "decode_s": info["decode_s"], "speed_vs_plain": round(plain_info["decode_s"] / max(info["decode_s"], 1e-9), 3),
        "verify_graphs": info["verify_graphs"], "acceptance_by_depth": info.get("acceptance_by_depth"),
    }  # fmt: skip


def _run_engine(rec: Recorder, name: str, model_dir: Path, plan: ParityPlan, prompts, extra: dict, finish=True):
    """(outputs, info), or None where the engine failed: the stage's end (`finish`), or a line
    for it and the next engine runs."""
    started = time.monotonic()
    try:
        outputs, info = _engine_outputs(model_dir, plan, prompts, extra)
    except Exception as exc:
        if finish:
            rec.finish("blocked", f"{name} engine: {_blocker(exc)}")
        else:
            rec.emit(f"{name}: engine failed: {_blocker(exc)}", engine=name, error=_blocker(exc))
        return None
    tokens = sum(len(o["output_ids"]) for o in outputs)
    rec.emit(f"{name}: {tokens} tokens, decode {info['decode_s']:.2f} s ({time.monotonic() - started:.1f} s with start-up)",
             engine=name, tokens=tokens, output_ids=[o["output_ids"] for o in outputs], **info)  # fmt: skip
    return outputs, info


# --- entry -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=("cost", "masks", "parity", "tree", "vocab"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--limit", type=float, default=600, help="the stage's limit in seconds (gpu_check.py)")
    parser.add_argument("--smoke", action="store_true", help="small shapes, on the CPU")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    rec = Recorder(args.out, args.stage)
    try:
        if args.stage == "cost":
            stage_cost(rec, SMOKE_COST if args.smoke else DEVICE_COST)
        elif args.stage == "masks":
            stage_masks(rec, SMOKE_MASKS if args.smoke else DEVICE_MASKS)
        elif args.stage in ("tree", "vocab"):
            import gpu_stages_cuda_path as cuda_path

            getattr(cuda_path, f"stage_{args.stage}")(rec, args.smoke, args.limit)
        else:
            stage_parity(rec, SMOKE_PARITY if args.smoke else DEVICE_PARITY, args.smoke)
    except Exception as exc:  # the stage's own blocker, recorded; the run goes on to the next
        rec.finish("blocked", _blocker(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
