"""The device check's replay stage end to end on this CPU (scripts/gpu_check.sh --cpu-smoke,
issue 85): both pairs in 2-layer shapes, the three engines of each on SPECSOT's CPU runtime,
the fixture trace folder replayed. Timings on a CPU mean nothing; what is checked is that every
configuration answered and that SPECSOT's replays served the accept lengths the trace promises
(the stage fails otherwise). Minutes of engine start-ups: the long tier."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "replay_traces"
CONFIGS = ("plain", "STANDALONE", "SPECSOT", "SoT-only", "SpecSoT")


@pytest.mark.long
def test_the_replay_stage_passes_its_cpu_smoke():
    env = dict(os.environ, SPECSOT_GPU_STAGES="replay", SPECSOT_GPU_SMOKE_ENGINES="1",
               SPECSOT_GPU_TRACES=str(FIXTURE), SPECSOT_GPU_PAIRS="1.5b,7b")  # fmt: skip
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu-smoke"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=1700)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[replay] ok" in out.stdout, out.stdout[-5000:]
    summaries = [
        line for line in out.stdout.splitlines() if line.startswith("  replay ")
    ]
    assert [line.split()[1] for line in summaries] == ["1.5b", "7b"], summaries
    assert all(config in line for line in summaries for config in CONFIGS), summaries
