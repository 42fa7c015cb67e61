"""SGLang's CUDA draft path for SPECSOT, run on the CPU: a twin that needs no GPU.

On a GPU, SPECSOT's draft model drafts through code the CPU runtime never runs: SGLang's Triton
attention backends (multi-step draft decode, draft-extend, verify in the FULL mask layout) and
the branches SGLang takes only for CUDA tensors (the top-1 chain written by
`draft_topk1_postprocess`, the fused draft-extend layout and inputs, draft slots and positions
from `assign_draft_cache_locs_contiguous`). This script runs exactly those on the CPU: Triton's
interpreter (TRITON_INTERPRET=1) executes the kernels in float32, and a shadow copy of the
installed SGLang takes the CUDA branches (`EDITS`: each replaces one `is_cuda` test by True and
counts the branch as it runs). Everything else is the installed SGLang and this checkout.

The model is the parity stage's small float32 random model at std 0.2 (at the stage's old 0.02
it answered with one token repeated, which any draft row reproduces). The twin runs plain and
SPECSOT with the model as its own draft (the whole window every step) on the Triton backend,
then the same self-draft on SPECSOT's CPU runtime, outside the shadow. It passes when SPECSOT
answers as plain does and accepts exactly the drafts the CPU runtime accepts, depth by depth:
a random model accepts only part of a self-draft (a standalone draft never sees the prompt's
first token; scripts/gpu_stage_parity.py `first_token_agreement`), so the count itself says nothing,
but any slot, position or row the CUDA path got wrong changes it.

    .venv/bin/python scripts/cuda_draft_twin.py            # one JSON line; exit 1 where it fails
    .venv/bin/python scripts/cuda_draft_twin.py --mutate   # the negative control: must fail

About 5 minutes on 2 cores, most of it three engines' start-ups.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARK = "SPECSOT_CUDA_TWIN"
_MARK_FN = f"\n\ndef _twin_mark(tag):\n    import sys\n    sys.stderr.write(f'{MARK} {{tag}}\\n')\n"


@dataclass(frozen=True)
class Edit:
    """One CUDA branch taken on CPU tensors: `old` (found exactly once in `path`, relative to
    the sglang package) becomes `new`; `branch` names the count its `_twin_mark` call keeps."""

    path: str
    old: str
    new: str
    branch: str | None = None


EDITS = (
    # Draft slots (and, below, positions) from SGLang's Triton kernels, not the CPU ops.
    Edit("kernels/ops/speculative/cache_locs.py", "_is_cpu = is_cpu()\n", "_is_cpu = False  # twin\n"),
    Edit("kernels/ops/speculative/cache_locs.py", "_is_cuda = is_cuda()\n", "_is_cuda = True  # twin\n"),
    Edit(
        "srt/speculative/eagle_worker_common.py",
        "            if batch.seq_lens.is_cuda and topk == 1:\n",
        "            if topk == 1:  # twin\n                _twin_mark('draft_positions')\n",
        "draft_positions",
    ),
    Edit(
        "srt/speculative/eagle_worker_common.py",
        "    fused_lengths = gpu_only and batch.seq_lens.is_cuda\n",
        "    fused_lengths = gpu_only  # twin\n    if fused_lengths:\n        _twin_mark('draft_extend_layout')\n",
        "draft_extend_layout",
    ),
    # The top-1 chain written into its preallocated tokens by the Triton argmax kernel.
    Edit(
        "srt/speculative/eagle_worker_v2.py",
        "            and (_is_cuda or _is_hip)\n            and self.hot_token_id is None\n",
        "            and True  # twin\n            and self.hot_token_id is None\n",
    ),
    Edit(
        "srt/speculative/eagle_worker_v2.py",
        "                    if _is_cuda or _is_hip:\n                        topk_p, topk_index = draft_topk1_postprocess(\n",
        "                    if True:  # twin\n                        _twin_mark('draft_topk1')\n"
        "                        topk_p, topk_index = draft_topk1_postprocess(\n",
        "draft_topk1",
    ),
    Edit(
        "srt/speculative/eagle_worker_v2.py",
        "        elif batch_result.accept_lens.is_cuda:\n",
        "        elif True:  # twin\n            _twin_mark('draft_extend_inputs')\n",
        "draft_extend_inputs",
    ),
)  # fmt: skip
BRANCHES = tuple(e.branch for e in EDITS if e.branch)
# `--mutate`: the negative control. Draft-extend reads its logits one row before the last
# accepted token (a wrong row of the kind a width or layout mistake makes), so the next draft
# starts from the wrong token: the twin must then fail on acceptance, with parity intact.
MUTATION = Edit(
    "kernels/ops/speculative/eagle.py",
    "tl.store(select + offset, offset * WIDTH + accepted - 1, offset < BS)",
    "tl.store(select + offset, offset * WIDTH + tl.maximum(accepted - 2, 0), offset < BS)",
)


def installed_sglang() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("sglang is not installed in this environment")
    return Path(next(iter(spec.submodule_search_locations)))


def check_edits(root: Path, edits: tuple[Edit, ...] = (*EDITS, MUTATION)) -> None:
    """Every edit's text occurs exactly once where it applies: a SGLang that moved one fails here."""
    for edit in edits:
        count = (root / edit.path).read_text().count(edit.old)
        if count != 1:
            raise ValueError(f"{edit.path}: the twin's edit text occurs {count} times, not once: {edit.old!r}")


def shadow_sglang(dest: Path, mutate: bool = False) -> Path:
    """A copy of the installed sglang package under `dest` with EDITS (and with `mutate`, the
    MUTATION) applied; returns `dest`, the folder to put first on PYTHONPATH."""
    source = installed_sglang()
    edits = (*EDITS, MUTATION) if mutate else EDITS
    check_edits(source, edits)
    target = dest / "sglang"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    edited = {}
    for edit in edits:
        text = edited.get(edit.path) or (target / edit.path).read_text()
        edited[edit.path] = text.replace(edit.old, edit.new)
    for path, text in edited.items():
        (target / path).write_text(text + (_MARK_FN if "_twin_mark(" in text else ""))
    return dest


def run_engines(mode: str) -> dict:
    """In a child process. `twin` (shadowed, interpreted): plain and SPECSOT self-draft on the
    Triton backend. `reference`: the self-draft on SPECSOT's CPU runtime."""
    import torch

    sys.path.insert(0, str(HERE))
    import gpu_stage_parity as gs

    plan = gs.SMOKE_PARITY
    # The parity stage's own engine runs (two calls, the second on a flushed cache), on the
    # CPU (SGLANG_USE_CPU_ENGINE=1): SPECSOT's CPU runtime, or SGLang's Triton backend.
    backend = {"attention_backend": "triton"} if mode == "twin" else {}
    with tempfile.TemporaryDirectory(prefix="specsot-cuda-twin-") as tmp:
        model_dir = gs.save_random_qwen2(plan, Path(tmp) / "model", torch.device("cpu"))  # seeded: the same model
        prompts = gs.parity_prompts(plan)
        spec = {"speculative_algorithm": "SPECSOT", "speculative_num_draft_tokens": plan.draft_tokens,
                "speculative_draft_model_path": str(model_dir), "disable_cuda_graph": True, **backend}  # fmt: skip
        drafted, info = gs.engine_outputs(model_dir, plan, prompts, spec)
        plain = gs.engine_outputs(model_dir, plan, prompts, backend)[0] if mode == "twin" else None
    ids = lambda outputs: [o["output_ids"] for o in outputs] if outputs is not None else None  # noqa: E731
    return {"output_ids": ids(drafted), "plain_output_ids": ids(plain), "acceptance_by_depth": info["acceptance_by_depth"]}


def _child(mode: str, env: dict) -> tuple[dict, str]:
    """`run_engines(mode)` in a fresh process: (its result, its stderr)."""
    proc = subprocess.run([sys.executable, __file__, "--engines", mode], env=env, capture_output=True, text=True,
                          timeout=1800)  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the {mode} engines failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1]), proc.stderr


def verdict(twin: dict, reference: dict, branch_counts: dict[str, int]) -> str | None:
    """Why the twin failed, or None."""
    missing = [b for b in BRANCHES if not branch_counts.get(b)]
    if missing:
        return f"the CUDA branches {missing} never ran: the twin did not exercise them"
    differs = [i for i, (a, b) in enumerate(zip(twin["plain_output_ids"], twin["output_ids"])) if a != b]
    if differs:
        return f"SPECSOT on the CUDA path differs from plain on prompts {differs}"
    if twin["acceptance_by_depth"] != reference["acceptance_by_depth"]:
        return "the CUDA draft path accepted other drafts than the CPU runtime did on the same model and prompts"
    return None


def main() -> int:
    if "--engines" in sys.argv:  # a child
        print(json.dumps(run_engines(sys.argv[sys.argv.index("--engines") + 1])), flush=True)
        return 0
    mutate = "--mutate" in sys.argv
    base = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "SGLANG_SPECSOT_FIXED_WINDOW": "1"}
    reference, _ = _child("reference", base)
    with tempfile.TemporaryDirectory(prefix="specsot-sglang-shadow-") as tmp:
        shadow = shadow_sglang(Path(tmp), mutate=mutate)
        # The Triton backend reads the FULL mask layout wherever it runs (SPECSOT picks the
        # layout by device, QLEN_ONLY on a CPU).
        env = {**base, "PYTHONPATH": os.pathsep.join(filter(None, [str(shadow), os.environ.get("PYTHONPATH")])),
               "TRITON_INTERPRET": "1", "SGLANG_SPECSOT_TREE_MASK_LAYOUT": "full"}  # fmt: skip
        twin, stderr = _child("twin", env)
    counts = {b: stderr.count(f"{MARK} {b}\n") for b in BRANCHES}
    problem = verdict(twin, reference, counts)
    print(json.dumps({"status": "failed" if problem else "ok", "problem": problem, "mutated": mutate,
                      "cuda_branches_run": counts, "acceptance_by_depth": twin["acceptance_by_depth"],
                      "cpu_runtime_acceptance_by_depth": reference["acceptance_by_depth"]}))  # fmt: skip
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
