"""Stage `parity` of the device check (scripts/gpu_stages.py): SPECSOT against plain decoding
through sglang.Engine on a random Qwen2 (greedy parity, graphs replayed, the target as its own
draft accepted as far as it can be); its engines' syncs are counted (gpu_stage_syncs.py)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import gpu_stage_syncs as syncs
from gpu_random_qwen2 import SMOKE_MODEL, Qwen2Shape, random_qwen2, stage_device
from gpu_record import Recorder, blocker


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


def engine_outputs(model_dir: Path, plan: ParityPlan, prompts, extra: dict) -> tuple[list[dict], dict]:
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


def import_sglang(rec: Recorder) -> None:
    import sglang
    import sglang.srt.entrypoints.engine  # noqa: F401  the scheduler's and model runner's imports

    kernel = sys.modules.get("sgl_kernel")
    origin = getattr(kernel, "__file__", None) if kernel else None
    rec.emit(f"sglang {sglang.__version__} imports (sgl_kernel: {origin or 'not imported'})",
             sglang=sglang.__version__, sgl_kernel=origin)  # fmt: skip


def stage_parity(rec: Recorder, plan: ParityPlan, smoke: bool) -> None:
    try:
        import_sglang(rec)
    except Exception as exc:
        rec.finish("blocked", f"importing SGLang: {blocker(exc)}")
        return
    with tempfile.TemporaryDirectory(prefix="specsot-parity-") as tmp:
        model_dir = save_random_qwen2(plan, Path(tmp) / "qwen2-random", stage_device())
        rec.emit(f"random Qwen2 saved ({sum(f.stat().st_size for f in model_dir.iterdir()) / 2**20:.0f} MiB)",
                 model=asdict(plan.model), dtype=plan.dtype)  # fmt: skip
        if smoke and not engines_on_cpu():
            rec.finish("ok", None, "smoke: the engines are not started (SPECSOT_GPU_SMOKE_ENGINES=1 starts them on the CPU)", smoke=True)  # fmt: skip
            syncs.record_syncs_smoke(rec.out)  # the sync counter's code, on a stand-in worker
            return
        prompts = parity_prompts(plan)
        trace = Path(tmp) / "plugin-trace.jsonl"
        # Verify on every step (not only where SPECSOT's costs say it pays), and a line per
        # process that loaded the plugin.
        os.environ.update(SGLANG_SPECSOT_TRACE_FILE=str(trace), SGLANG_SPECSOT_FIXED_WINDOW="1")
        plain = run_engine(rec, "plain", model_dir, plan, prompts, {})  # with SGLang's decode graphs
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
            sync_logs[name], sync_env = syncs.sync_log_env(Path(tmp), name)
            os.environ.update(sync_env)
            runs[name] = run_engine(rec, name, model_dir, plan, prompts, extra, finish=False)
        syncs.record_syncs(rec.out, sync_logs)
        plugin = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
        agreement = _self_draft_expectation(model_dir, plan, prompts, plain[0])
        rec.emit(f"first-token agreement along plain's answers: {agreement['agreeing']} of {agreement['positions']}",
                 self_draft_expected=agreement)  # fmt: skip
    blocked = [name for name, run in runs.items() if run is None]
    results = {name: compared(plain, run) for name, run in runs.items() if run is not None}
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

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, plan.dtype)).to(stage_device()).eval()
    agreeing, positions = first_token_agreement(model, prompts, [o["output_ids"] for o in plain_outputs])
    return {"agreeing": agreeing, "positions": positions, "share": round(agreeing / max(positions, 1), 4)}


def compared(plain, run) -> dict:
    """A SPECSOT run against plain's: mismatched prompts, accept lengths, time, graph replays."""
    (plain_out, plain_info), (out, info) = plain, run
    return {
        "mismatched_prompts": [i for i, (a, b) in enumerate(zip(plain_out, out)) if a["output_ids"] != b["output_ids"]],
        "accept_length": [r["meta_info"].get("spec_accept_length") for r in out],
        "decode_s": info["decode_s"], "speed_vs_plain": round(plain_info["decode_s"] / max(info["decode_s"], 1e-9), 3),
        "verify_graphs": info["verify_graphs"], "acceptance_by_depth": info.get("acceptance_by_depth"),
    }  # fmt: skip


def run_engine(rec: Recorder, name: str, model_dir: Path, plan: ParityPlan, prompts, extra: dict, finish=True):
    """(outputs, info), or None where the engine failed: the stage's end (`finish`), or a line
    for it and the next engine runs."""
    started = time.monotonic()
    try:
        outputs, info = engine_outputs(model_dir, plan, prompts, extra)
    except Exception as exc:
        if finish:
            rec.finish("blocked", f"{name} engine: {blocker(exc)}")
        else:
            rec.emit(f"{name}: engine failed: {blocker(exc)}", engine=name, error=blocker(exc))
        return None
    tokens = sum(len(o["output_ids"]) for o in outputs)
    rec.emit(f"{name}: {tokens} tokens, decode {info['decode_s']:.2f} s ({time.monotonic() - started:.1f} s with start-up)",
             engine=name, tokens=tokens, output_ids=[o["output_ids"] for o in outputs], **info)  # fmt: skip
    return outputs, info
