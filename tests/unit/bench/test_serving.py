"""bench_serving glue without a server: the custom dataset, the command, resume and the table."""

from __future__ import annotations

import json

from sglang_specsot.bench.cells import Question
from sglang_specsot.bench.provenance import INVOCATIONS_FILE, record_invocation
from sglang_specsot.bench.serving import (
    bench_command,
    failure_lines,
    failures,
    finished,
    latest,
    merge,
    write_dataset,
)


def test_dataset_is_bench_servings_custom_format(tmp_path):
    path = write_dataset([Question(1, "Why?", True)], tmp_path / "q.jsonl", 4)
    (row,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert row["conversations"][0] == {"role": "user", "content": "Why?"}
    assert row["conversations"][1]["role"] == "assistant"


def test_command_sends_sot_through_the_extra_request_body(tmp_path):
    cmd = bench_command("http://h", "/m", tmp_path / "q.jsonl", 5, 8, 64, {"specsot": {"mode": "on"}}, tmp_path / "o")
    assert cmd[1:3] == ["-m", "sglang.benchmark.serving"]
    assert cmd[cmd.index("--max-concurrency") + 1] == "8" and cmd[cmd.index("--dataset-name") + 1] == "custom"
    assert json.loads(cmd[cmd.index("--extra-request-body") + 1]) == {"specsot": {"mode": "on"}}
    assert "--disable-ignore-eos" in cmd  # answers end where the model ends them
    assert "--extra-request-body" not in bench_command("http://h", "/m", tmp_path, 5, 1, 64, {}, tmp_path / "o")


def test_resume_skips_measured_pairs_and_the_table_keeps_the_latest(tmp_path):
    merged = tmp_path / "serving.jsonl"
    rows = [{"config": "plain", "concurrency": 1, "median_e2e_latency_ms": 9.0},
            {"config": "SoT", "concurrency": 1, "error": "boom"},
            {"config": "plain", "concurrency": 1, "median_e2e_latency_ms": 7.0},
            {"config": "SoT", "error": "server did not start"}]  # fmt: skip
    merged.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert finished(merged) == {("plain", 1)}
    assert [r["median_e2e_latency_ms"] for r in latest(merged)] == [7.0]
    table = merge(latest(merged))
    assert table.splitlines()[2].startswith("| plain | 1 | - | ") and "| 7.0 |" in table
    assert finished(tmp_path / "missing.jsonl") == set()


def test_failed_runs_show_in_the_table_until_a_later_run_succeeds(tmp_path):
    merged = tmp_path / "serving.jsonl"
    rows = [{"config": "plain", "concurrency": 1, "error": "first try timed out"},
            {"config": "plain", "concurrency": 1, "median_e2e_latency_ms": 7.0},
            {"config": "SoT", "concurrency": 8, "error": "bench_serving exited 1"},
            {"config": "NGRAM", "error": "server did not start"}]  # fmt: skip
    merged.write_text("".join(json.dumps(r) + "\n" for r in rows))
    shown = failure_lines(failures(merged))
    assert "SoT at concurrency 8: bench_serving exited 1" in shown and "NGRAM: server did not start" in shown
    assert "first try" not in shown  # superseded by the result after it
    assert failure_lines([]) == ""


def test_each_invocation_is_recorded_with_its_command_commit_and_machine(tmp_path):
    first = record_invocation(tmp_path, ["bench", "serving", "--target", "qwen2.5-coder-1.5b"])
    record_invocation(tmp_path, ["bench", "e2e", "--target", "qwen2.5-coder-1.5b"], servers="all servers up")
    lines = [json.loads(line) for line in (tmp_path / INVOCATIONS_FILE).read_text().splitlines()]
    assert len(lines) == 2 and lines[0] == first
    assert first["command"] == "python -m sglang_specsot.bench serving --target qwen2.5-coder-1.5b"
    assert first["machine"]["cores"] >= 1 and first["machine"]["cpu"] and len(first["commit"]) >= 7
    assert "servers" not in first and lines[1]["servers"] == "all servers up"

