"""scripts/own_capture_twin.py: SPECSOT's verify graphs through SGLang's own capture and replay.

It runs, in a CPU engine with SGLang's Triton backend interpreted, SGLang's
`DecodeCudaGraphRunner.__init__` / `capture` / `capture_one_shape` / `capture_prepare` /
`get_spec_info` (SPECSOT's subclass) for every verify tier, then at every decode step
`ModelRunner.forward` -> `can_run_graph` -> `execute` -> `load_batch` -> the recorded graph's
replay, with only the CUDA graph object, the capture stream and two CUDA-only gates stood in for
(scripts/own_capture_stand_ins.py). A test drafter mode proposes branching trees at every tier.
On the code before SPECSOT's runner class (3cabdad) it fails: the graphs were captured with no
verify input, Triton's kernel with USE_CUSTOM_MASK off, and the graph-path logits of branching
trees differ from the eager path's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.long,
]  # two CPU engines, Triton interpreted: minutes

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "own_capture_twin.py"


def test_own_capture_graph_verify_equals_eager_and_plain_on_branching_trees():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=3600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stderr[-4000:]
    result = json.loads(lines[-1])
    assert proc.returncode == 0 and result["status"] == "ok", result
    assert result["prompts"] >= 16 and result["max_abs_logit_diff"] <= 1e-4
    # Branching trees replayed at every tier that can hold a branch, each compared with eager.
    assert all(result["branching_replays_by_width"].get(str(w)) for w in result["tiers"] if w >= 3), result
