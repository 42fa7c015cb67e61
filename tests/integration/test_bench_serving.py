"""SGLang's `bench_serving`, with the command line `python -m sglang_specsot.bench serving` builds
(bench/serving.py: `bench_command`, `write_dataset`), against a small SPECSOT server: the shared
SmolLM2-135M one, two SoT answers through `--extra-request-body`. Proves the benchmark's real
client path: its JSON result line says both requests completed, with output tokens and latencies.
"""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from sglang_specsot.bench.cells import flush_cache
from sglang_specsot.bench.serving import CONFIGS, bench_command, write_dataset
from tests.integration.conftest import RECEIVED_RID, log_since, log_size, sot_rids

pytestmark = [pytest.mark.integration, pytest.mark.long]

QUESTIONS = ["How can I improve my time management skills?", "What are the most effective ways to deal with stress?"]
MAX_TOKENS = 200  # room for a skeleton and its points: a smaller cap is answered normally


def test_bench_serving_runs_sot_answers_on_a_specsot_server(shared_specsot_server, smollm2_path, tmp_path):
    server = shared_specsot_server
    dataset = write_dataset([SimpleNamespace(text=q) for q in QUESTIONS], tmp_path / "questions.jsonl", MAX_TOKENS)
    _, body = CONFIGS["SpecSoT"]  # {"specsot": {"mode": "on"}}
    raw = tmp_path / "raw.jsonl"
    cmd = bench_command(server.base_url, smollm2_path, dataset, len(QUESTIONS), 2, MAX_TOKENS, body, raw)
    assert cmd[1:3] == ["-m", "sglang.benchmark.serving"], cmd
    flush_cache(server.base_url, 60.0)
    start = log_size(server)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    result = json.loads(raw.read_text().splitlines()[-1])
    assert result["completed"] == len(QUESTIONS), result
    assert result["total_output_tokens"] > 0 and result["output_throughput"] > 0, result
    assert 0 < result["median_ttft_ms"] <= result["median_e2e_latency_ms"], result
    # The server answered them with SoT: its log names each group's skeleton generation.
    skeletons = sot_rids(RECEIVED_RID, log_since(server, start), role="skeleton")
    assert len(skeletons) == len(QUESTIONS), skeletons
