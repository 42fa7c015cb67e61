"""SPECSOT's verify graphs through SGLang's own capture and replay code, on the CPU.

On a GPU, SPECSOT's worker captures one `DecodeCudaGraphRunner` per verify tier
(speculative/verify_runners.py) and every decode step replays one. This twin runs exactly that
code path in an SGLang engine on the CPU: SGLang's `DecodeCudaGraphRunner.__init__` ->
`capture` -> `capture_one_shape` -> `capture_prepare` -> `get_spec_info`, and at every step its
`can_run_graph` -> `execute` -> `load_batch` -> replay, with SGLang's Triton attention backend
whose kernels Triton interprets (TRITON_INTERPRET=1, float32). Only what a CPU has no
equivalent for is stood in for (`own_capture_site/sitecustomize.py` installs it in the engine's
processes):

- the CUDA graph object: `RecordedGraphs`, a graph backend that keeps the captured callable
  (SGLang's `run_once`) and the attention metadata its kernels were launched with, and at replay
  re-runs that callable on the runner's static buffers, as the graph re-launches its kernels
  with their captured arguments (the Triton kernel's USE_CUSTOM_MASK among them);
- the capture stream (`graph_capture`): a CPU has none;
- the worker's "captures graphs on CUDA only" gate, taken as a GPU takes it.

A test drafter mode proposes branching trees at every tier (`oracle_tree`): from plain's greedy
answers, a wrong branch first and the true continuation second, so a verify that treats the
tree as a chain (the true branch attending the wrong one) gives wrong logits and, where the true
branch is accepted, wrong tokens. Every replayed verify is run again eagerly on the same batch
and their logits compared.

    .venv/bin/python scripts/own_capture_twin.py          # one JSON line; exit 1 where it fails
    .venv/bin/python scripts/own_capture_twin.py --plain-out FILE   # also keep plain's answers
    .venv/bin/python scripts/own_capture_twin.py --plain-in FILE    # reuse them (the same SGLang)
    python3 scripts/own_capture_twin.py --device cuda   # on a GPU: no stand-ins (device check)
    .venv/bin/python scripts/own_capture_twin.py --small            # smaller plan (CPU smoke)

With `--device cuda` nothing is stood in for: SGLang's runner captures real
torch.cuda.CUDAGraphs and replays them, Triton compiles its kernels for the GPU; the test drafter
mode and the graph-vs-eager comparison are the same (SPECSOT_OWN_CAPTURE_TWIN=cuda).

It passes when every replayed verify's logits equal the eager forward's, SPECSOT's greedy output
equals plain's on every prompt, and every tier replayed, with branching trees at every tier of
width >= 3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SITE = HERE / "own_capture_site"
LOG_ENV = "SPECSOT_OWN_CAPTURE_LOG"  # the scheduler's JSON lines: one per replayed verify
ORACLE_ENV = "SPECSOT_OWN_CAPTURE_ORACLE"  # plain's answers, for the test drafter mode
TWIN_ENV = "SPECSOT_OWN_CAPTURE_TWIN"  # "1": the stand-ins and test mode; "cuda": test mode alone
DEVICE_ENV = "SPECSOT_OWN_CAPTURE_DEVICE"  # "cpu" (the default) or "cuda", for the engine children
PLAN_ENV = "SPECSOT_OWN_CAPTURE_PLAN"  # "small": SMALL_PLAN, for the engine children
LOGITS_TOLERANCE = 1e-4  # float32, the same kernels on the same rows: equal but for summation order
# On a GPU the graph pads the batch to its captured size, so cuBLAS may pick another kernel (and
# TF32) for the eager path's shapes; a tree verified as a chain is off by far more (0.1 and up).
CUDA_LOGITS_TOLERANCE = 2e-3


@dataclass(frozen=True)
class Plan:
    prompts: int = 16
    prompt_len: int = 12
    max_new: int = 12
    window: int = 8  # verify tiers 1, 2, 4, 8
    max_running: int = 4  # capture sizes 1, 2, 4


SMALL_PLAN = Plan(prompts=4, prompt_len=12, max_new=8, window=4, max_running=2)  # tiers 1, 2, 4
PLAN = SMALL_PLAN if os.environ.get(PLAN_ENV) == "small" else Plan()


def engine_kwargs(mode: str, device: str, plan: Plan = PLAN) -> dict:
    """sglang.Engine's arguments for plain (no graphs) or SPECSOT (verify graphs per tier) on
    `device`: SGLang's Triton backend either way, float32, a small KV pool."""
    spec = {"speculative_algorithm": "SPECSOT", "speculative_num_draft_tokens": plan.window} if mode == "specsot" else {}
    graphs = {"cuda_graph_max_bs_decode": plan.max_running} if mode == "specsot" else {"disable_cuda_graph": True}
    on_gpu = {"mem_fraction_static": 0.3} if device == "cuda" else {}
    return dict(
        skip_tokenizer_init=True, dtype="float32", sampling_backend="pytorch", random_seed=0, device=device,
        attention_backend="triton", max_total_tokens=4096, max_running_requests=plan.max_running,
        disable_prefill_cuda_graph=True, log_level="warning", **spec, **graphs, **on_gpu,
    )  # fmt: skip


def twin_env(device: str, small: bool, environ=os.environ) -> dict:
    """The engines' environment: on the CPU SGLang's CPU engine with Triton interpreted; on a GPU
    nothing added but what SPECSOT's check needs (every step at the full window)."""
    env = {**environ, DEVICE_ENV: device, "SGLANG_SPECSOT_FIXED_WINDOW": "1"}
    if device == "cpu":
        env.update({"SGLANG_USE_CPU_ENGINE": "1", "TRITON_INTERPRET": "1", "SGLANG_SPECSOT_TREE_MASK_LAYOUT": "full"})
    if small:
        env[PLAN_ENV] = "small"
    return env


# -- the test drafter mode: branching trees from plain's answers ---------------------------------


def oracle_tree(history: list[int], width: int, answers: dict[tuple, list[int]], vocab: int):
    """(tokens, parents) of a `width`-node tree rooted at `history[-1]`: where width allows,
    a wrong branch first and the true continuation (plain's answer) second, breadth first, so
    a chain-causal verify makes the true branch attend the wrong one. None where `history` is
    no prefix of a known answer."""
    truth = _continuation(history, answers)
    if truth is None:
        return None
    truth = (truth + [3] * width)[: width - 1]
    wrong_len = (width - 1) // 2
    wrong = [(t + 1 + d) % vocab or 3 for d, t in enumerate(truth[:wrong_len])]
    tokens, parents, last = [history[-1]], [-1], {"wrong": 0, "true": 0}
    for depth in range(width - 1):
        for kind, seq in (("wrong", wrong), ("true", truth[: width - 1 - wrong_len])):
            if depth < len(seq):
                tokens.append(seq[depth])
                parents.append(last[kind])
                last[kind] = len(tokens) - 1
    return tokens, parents


def _continuation(history: list[int], answers: dict[tuple, list[int]]) -> list[int] | None:
    for prompt, answer in answers.items():
        full = list(prompt) + answer
        if len(full) >= len(history) and full[: len(history)] == history:
            return full[len(history) :]
    return None


# -- the engines ----------------------------------------------------------------------------------


def run_engine(mode: str, model_dir: str, prompts: list[list[int]]) -> dict:
    """In a child process: plain, or SPECSOT with verify graphs; greedy outputs and the
    server's verify report."""
    import sglang

    engine = sglang.Engine(model_path=model_dir, **engine_kwargs(mode, os.environ.get(DEVICE_ENV, "cpu")))
    try:
        params = {
            "temperature": 0.0,
            "max_new_tokens": PLAN.max_new,
            "ignore_eos": True,
        }
        outputs = engine.generate(input_ids=prompts, sampling_params=params)
        states = engine.get_server_info().get("internal_states") or [{}]
        verify = (states[0].get("specsot") or {}).get("verify_graphs")
    finally:
        engine.shutdown()
    return {"output_ids": [o["output_ids"] for o in outputs], "verify_graphs": verify}


def _child(mode: str, env: dict, model_dir: str, prompts_file: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--engine", mode, model_dir, prompts_file], env=env,
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the {mode} engine failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1])


def _plain(env: dict, model_dir: str, prompts_file: str) -> dict:
    """Plain's greedy answers: run here, or read back with --plain-in (kept by --plain-out)."""
    if "--plain-in" in sys.argv:
        return json.loads(Path(sys.argv[sys.argv.index("--plain-in") + 1]).read_text())
    plain = _child("plain", env, model_dir, prompts_file)
    if "--plain-out" in sys.argv:
        Path(sys.argv[sys.argv.index("--plain-out") + 1]).write_text(json.dumps(plain))
    return plain


def _replays(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _differs(plain: dict, twin: dict) -> list[int]:
    """The prompts whose greedy answers differ."""
    return [i for i, (a, b) in enumerate(zip(plain["output_ids"], twin["output_ids"])) if a != b]


def verdict(plain: dict, twin: dict, replays: list[dict], widths: tuple[int, ...], tol: float = LOGITS_TOLERANCE) -> str | None:
    """Why the twin failed, or None."""
    verify = twin["verify_graphs"] or {}
    if verify.get("graphs") is not True:
        return f"the server did not verify through captured graphs: {verify}"
    if not replays:
        return "no verify replayed a graph"
    worst = max(r["max_abs_diff"] for r in replays)
    if worst > tol:
        bad = sorted({(r["width"], r["branching"]) for r in replays if r["max_abs_diff"] > tol})
        return f"graph-path verify logits differ from the eager path's by up to {worst:.3g} at (width, branching) {bad}"
    differs = _differs(plain, twin)
    if differs:
        return f"SPECSOT through its verify graphs answers otherwise than plain on prompts {differs}"
    unbranched = [w for w in widths if w >= 3 and not any(r["width"] == w and r["branching"] for r in replays)]
    if unbranched:
        return f"no branching tree replayed at tiers {unbranched}"
    return None


def main() -> int:
    if "--engine" in sys.argv:  # a child
        mode, model_dir, prompts_file = sys.argv[sys.argv.index("--engine") + 1 :][:3]
        print(
            json.dumps(run_engine(mode, model_dir, json.loads(Path(prompts_file).read_text()))),
            flush=True,
        )
        return 0
    import torch

    sys.path.insert(0, str(HERE))
    import gpu_stage_parity as gs
    from gpu_random_qwen2 import SMOKE_MODEL

    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"
    small = "--small" in sys.argv
    run_plan = SMALL_PLAN if small else PLAN
    plan = gs.ParityPlan(
        SMOKE_MODEL,
        prompts=run_plan.prompts,
        prompt_len=run_plan.prompt_len,
        max_new=run_plan.max_new,
    )
    base = twin_env(device, small)
    with tempfile.TemporaryDirectory(prefix="specsot-own-capture-") as tmp:
        model_dir = str(gs.save_random_qwen2(plan, Path(tmp) / "model", torch.device("cpu")))
        prompts = gs.parity_prompts(plan)
        prompts_file = Path(tmp) / "prompts.json"
        prompts_file.write_text(json.dumps(prompts))
        plain = _plain(base, model_dir, str(prompts_file))
        oracle = Path(tmp) / "oracle.json"
        oracle.write_text(
            json.dumps(
                {
                    "prompts": prompts,
                    "answers": plain["output_ids"],
                    "vocab": plan.model.vocab,
                }
            )
        )
        log = Path(tmp) / "replays.jsonl"
        env = {**base, TWIN_ENV: "1" if device == "cpu" else "cuda", LOG_ENV: str(log), ORACLE_ENV: str(oracle),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(SITE), str(HERE), os.environ.get("PYTHONPATH")]))}  # fmt: skip
        twin = _child("specsot", env, model_dir, str(prompts_file))
        replays = _replays(log)
    widths = tuple((twin["verify_graphs"] or {}).get("tiers") or ())
    tol = LOGITS_TOLERANCE if device == "cpu" else CUDA_LOGITS_TOLERANCE
    problem = verdict(plain, twin, replays, widths, tol)
    print(json.dumps({
        "status": "failed" if problem else "ok", "problem": problem, "tiers": widths,
        "replays": len(replays), "branching_replays_by_width": _branching_by_width(replays),
        "max_abs_logit_diff": max((r["max_abs_diff"] for r in replays), default=None),
        "verify_graphs": twin["verify_graphs"],
        "differs_from_plain": _differs(plain, twin), "prompts": len(prompts), "device": device, "tolerance": tol,
    }))  # fmt: skip
    return 1 if problem else 0


def _branching_by_width(replays: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in replays:
        if r["branching"]:
            counts[str(r["width"])] = counts.get(str(r["width"]), 0) + 1
    return counts


if __name__ == "__main__":
    sys.exit(main())
