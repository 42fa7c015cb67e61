"""The device check's stages on SGLang's own CUDA path (issue 83, "The device check"):

- `tree`: scripts/own_capture_twin.py with `--device cuda`: no stand-ins, so SGLang's
  DecodeCudaGraphRunner captures real torch.cuda.CUDAGraphs per verify tier and replays them,
  Triton compiled for the GPU; the twin's test drafter mode proposes branching trees at every
  tier; every replayed verify's logits are compared with an eager forward of the same batch, and
  greedy output with plain's on 16 prompts. On the CPU smoke: the same twin, `--small`, with its
  CPU stand-ins and Triton interpreted.
- `vocab`: a random-weight target with Qwen2.5-7B's vocabulary (152,064 rows) and a draft cut to
  Qwen2.5-0.5B's (151,936, models/tiny.py `cut_vocabulary`), SPECSOT with the draft model
  against plain decoding (greedy parity, drafts accepted, verify graphs replayed), its blocking
  syncs counted per step (scripts/gpu_sync_count.py).
- the `syncs` record (scripts/gpu_stage_syncs.py): the parity stage's SPECSOT engines counted
  per step.

On this project's 2-core CPU (541e7d9): `scripts/gpu_check.sh --cpu-smoke` 2 min 56 s in all, the
tree stage's CPU twin (--small) 129 s, ok; with SPECSOT_GPU_SMOKE_ENGINES=1 the vocab stage's two
CPU engines 47 s and the parity stage's five 99 s, the scheduler's sync counter logging every step
(`counted: false`: no CUDA). None of it has run on a GPU yet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import gpu_stage_parity as parity_stage
from gpu_random_qwen2 import Qwen2Shape
from gpu_record import Recorder
import gpu_sync_count

HERE = Path(__file__).resolve().parent
TWIN = HERE / "own_capture_twin.py"
MARGIN_S = 10  # what a stage keeps of its limit to record why its child did not finish


# --- tree: branching trees through real CUDA graphs ---------------------------------------------


def twin_command(smoke: bool) -> list[str]:
    """The twin on the GPU, or (smoke) on the CPU with its stand-ins and the small plan."""
    return [sys.executable, "-u", str(TWIN), *(["--device", "cpu", "--small"] if smoke else ["--device", "cuda"])]


def twin_problem(result: dict | None, rc: int, stderr: str) -> str | None:
    """Why the tree stage fails, from the twin's JSON line and exit status, or None."""
    if result is None:
        return f"the twin printed no result (rc {rc}): {stderr.strip()[-1500:] or 'no stderr'}"
    if result.get("status") != "ok" or rc != 0:
        return result.get("problem") or f"the twin exited {rc}"
    return None


def stage_tree(rec: Recorder, smoke: bool, limit_s: float) -> None:
    cmd = twin_command(smoke)
    rec.emit(f"running {' '.join(cmd[2:])}", command=cmd[2:])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(limit_s - MARGIN_S, 5))
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-2000:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        rec.finish("failed", f"the twin ran past {limit_s - MARGIN_S:.0f} s; its stderr ends: {tail}")
        return
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else None
    if result is not None:
        rec.emit(f"tiers {result['tiers']}, {result['replays']} replayed verifies, branching by width "
                 f"{result['branching_replays_by_width']}, max |graph - eager| {result['max_abs_logit_diff']} "
                 f"(tol {result.get('tolerance')}), differs from plain on {result['differs_from_plain']}",
                 twin=result)  # fmt: skip
    problem = twin_problem(result, proc.returncode, proc.stderr)
    rec.finish("ok" if problem is None else "failed", problem, device=(result or {}).get("device"),
               stderr_tail=None if problem is None else proc.stderr[-2500:])  # fmt: skip


# --- vocab: Qwen2.5-7B's vocabulary, a 0.5B-shaped draft ----------------------------------------


@dataclass(frozen=True)
class VocabPlan:
    target_vocab: int = 152064  # Qwen2.5-7B
    draft_vocab: int = 151936  # Qwen2.5-0.5B
    hidden: int = 64
    layers: int = 2
    prompts: int = 4
    prompt_len: int = 24
    max_new: int = 16
    draft_steps: int = 3
    draft_tokens: int = 6
    min_accept: float = 1.5  # the draft is the target on its rows: most drafts are accepted


DEVICE_VOCAB = VocabPlan()
SMOKE_VOCAB = VocabPlan(target_vocab=1024, draft_vocab=1000, prompts=2, prompt_len=12, max_new=8)
PROMPT_IDS = 259  # the tokenizer's special tokens and byte alphabet: ids every tiny tokenizer has


def vocab_parity_plan(plan: VocabPlan) -> parity_stage.ParityPlan:
    """The parity stage's engine plan for the pair (float32: token identity is exact)."""
    shape = Qwen2Shape(hidden=plan.hidden, layers=plan.layers, vocab=PROMPT_IDS)  # vocab: the prompts' ids
    return parity_stage.ParityPlan(shape, dtype="float32", prompts=plan.prompts, prompt_len=plan.prompt_len,
                         max_new=plan.max_new, draft_tokens=plan.draft_tokens)  # fmt: skip


def build_pair(plan: VocabPlan, root: Path) -> tuple[Path, Path]:
    """(target, draft): a random target with `target_vocab` rows, the draft its first `draft_vocab`."""
    from sglang_specsot.models.tiny import build_tiny_model, cut_vocabulary

    target = build_tiny_model(root / "target", vocab_size=plan.target_vocab, num_layers=plan.layers,
                              hidden_size=plan.hidden, seed=3, dtype="float32")  # fmt: skip
    return target, cut_vocabulary(target, root / "draft", plan.draft_vocab)


def accept_problem(accept: list, floor: float) -> str | None:
    values = [a for a in accept if a is not None]
    if not values:
        return "no accept length was reported"
    mean = sum(values) / len(values)
    return None if mean > floor else f"mean accept length {mean:.2f} is not above {floor} (the draft is the target's rows)"


def stage_vocab(rec: Recorder, smoke: bool, limit_s: float) -> None:
    plan = SMOKE_VOCAB if smoke else DEVICE_VOCAB
    parity_stage.import_sglang(rec)
    with tempfile.TemporaryDirectory(prefix="specsot-vocab-") as tmp:
        target, draft = build_pair(plan, Path(tmp))
        sizes = {p.name: json.loads((p / "config.json").read_text())["vocab_size"] for p in (target, draft)}
        rec.emit(f"target vocabulary {sizes['target']}, draft {sizes['draft']}", plan=asdict(plan), vocab=sizes)
        if sizes != {"target": plan.target_vocab, "draft": plan.draft_vocab}:
            rec.finish("failed", f"the pair was built with vocabularies {sizes}")
            return
        if smoke and not parity_stage.engines_on_cpu():
            rec.finish("ok", None, "smoke: the engines are not started (SPECSOT_GPU_SMOKE_ENGINES=1 starts them on the CPU)", smoke=True)  # fmt: skip
            return
        parity = vocab_parity_plan(plan)
        prompts = parity_stage.parity_prompts(parity)
        os.environ["SGLANG_SPECSOT_FIXED_WINDOW"] = "1"
        tokenizer = {"skip_tokenizer_init": False}  # the worker compares the two tokenizers' shared ids
        plain = parity_stage.run_engine(rec, "plain", target, parity, prompts, tokenizer | {"disable_cuda_graph": True})
        if plain is None:
            return
        log = Path(tmp) / "syncs.jsonl"
        os.environ.update(gpu_sync_count.engine_env(log))
        spec = {"speculative_algorithm": "SPECSOT", "speculative_num_steps": plan.draft_steps,
                "speculative_num_draft_tokens": plan.draft_tokens, "speculative_draft_model_path": str(draft)}  # fmt: skip
        run = parity_stage.run_engine(rec, "SPECSOT draft model", target, parity, prompts, tokenizer | spec, finish=False)
        if run is None:
            rec.finish("failed", "the SPECSOT engine with the prefix-vocabulary draft did not run (its line above)")
            return
        sync_problem = gpu_sync_count.report(rec, "SPECSOT draft model", log)
    compared = parity_stage.compared(plain, run)
    graphs = compared["verify_graphs"] or {}
    problem = (f"SPECSOT differs from plain on prompts {compared['mismatched_prompts']}" if compared["mismatched_prompts"]
               else accept_problem(compared["accept_length"], plan.min_accept)
               or (None if smoke or graphs.get("replayed_by_width") else f"the verify graphs never replayed: {graphs}")
               or sync_problem)  # fmt: skip
    rec.finish("ok" if problem is None else "failed", problem, run=compared, vocab=sizes)
