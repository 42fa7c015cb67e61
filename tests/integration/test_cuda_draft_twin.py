"""scripts/cuda_draft_twin.py: SGLang's CUDA draft path (its Triton kernels interpreted, its
CUDA-only branches taken) drafts exactly what SPECSOT's CPU runtime drafts, and a wrong
draft-extend row (the negative control) makes it fail."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.long]  # about 5 minutes a run on 2 cores

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cuda_draft_twin.py"


def _twin(*args: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stderr[-4000:]
    return proc.returncode, json.loads(lines[-1])


def test_the_cuda_draft_path_drafts_what_the_cpu_runtime_drafts():
    rc, result = _twin()
    assert rc == 0 and result["status"] == "ok", result
    assert all(result["cuda_branches_run"].values()), result["cuda_branches_run"]
    depth = result["acceptance_by_depth"]["extend"]
    # A random model rejects part of its own drafts (the first token a standalone draft never
    # sees), and the twin matched the CPU runtime there, not everywhere accepted.
    assert 0 < sum(depth["accepted"]) < sum(depth["reached"])


def test_a_wrong_draft_extend_row_is_caught():
    rc, result = _twin("--mutate")
    assert rc == 1 and result["status"] == "failed" and result["mutated"], result
    assert "accepted other drafts than the CPU runtime" in result["problem"]
