"""The benchmark's smoke mode, run as a user runs it: SmolLM2-135M in float32, 2 questions
(one SoT-suitable, one not), plain decoding, SoT on the plain server and SpecSoT on a SPECSOT
server; then a re-run resumes with nothing to do, and `report` rebuilds everything."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.long]

SOT_CONFIG = {"skeleton_max_tokens": 48, "max_points": 3, "max_running": 3, "default_branch_tokens": 16,
              "min_branch_tokens": 8, "router_min_answer_tokens": 1}  # fmt: skip


def bench(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_specsot.bench", *argv], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=900)  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory, smollm2_path):
    out = tmp_path_factory.mktemp("bench") / "run"
    argv = ["e2e", "--target", "smollm2-135m", "--suitable", "1", "--unsuitable", "1",
            "--configs", "SoT-server,SpecSoT-server", "--max-tokens", "64", "--dtype", "float32",
            "--timeout", "300", "--sot-config", json.dumps(SOT_CONFIG), "--out", str(out)]  # fmt: skip
    first = bench(*argv)
    assert first.returncode == 0, first.stderr[-3000:]
    return out, argv, first


def test_every_cell_is_recorded_and_succeeds(run):
    out, _, first = run
    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert sorted((c["question_id"], c["config"]) for c in cells) == sorted(
        (q, c) for q in (0, 16) for c in ("plain", "SoT-server", "SpecSoT-server"))  # fmt: skip
    assert all(c["status"] == "ok" and c["latency"] > 0 and c["answer"] for c in cells), first.stderr[-2000:]
    # SmolLM2's skeletons often loop or hit their cap and fall back to the normal answer; the
    # cell must then say so, and otherwise carry its points and branches.
    for c in (c for c in cells if c["config"] == "SpecSoT-server"):
        assert c["skeleton_text"].startswith("1.")
    # Server-side SoT constrains every skeleton by default: on SPECSOT, and on the plain
    # server, which the benchmark starts with delayed sampling so its processors see the
    # current output (the client sends no processor).
    for c in (c for c in cells if c["config"] != "plain" and c["skeleton_text"]):
        assert c["skeleton_constrained"] is True, c
        assert (c["path"] == "sot" and c["points"] >= 2 and c["branches"]) or (c["path"] == "normal" and c["fallback"])


def test_report_table_plots_and_lossless_speculation(run):
    out, _, first = run
    report = json.loads((out / "report.json").read_text())
    configs = {row["config"] for row in report["summary"]}
    assert configs == {"plain", "SoT-server", "SpecSoT-server"}
    assert "| config | subset |" in first.stdout and (out / "report.md").exists()
    # float32 greedy: SpecSoT must give exactly SoT-without-speculation's answers.
    assert report["greedy_equality"]["SpecSoT-server == SoT-server"]["equal"] == 2
    suitable = next(r for r in report["summary"] if r["config"] == "SpecSoT-server" and r["subset"] == "suitable")
    assert 0.0 <= suitable["normal_covered"] <= 1.0 and suitable["speedup"] > 0
    assert (out / "plots" / "speedup-suitable.png").stat().st_size > 0
    sot_questions = {r["question_id"] for r in report["per_question"] if r["path"] == "sot"}
    assert {f"plots/timeline-q{q}.png" for q in sot_questions} <= set(report["plots"])


def test_a_rerun_resumes_with_nothing_left_and_report_rebuilds(run):
    out, argv, _ = run
    again = bench(*argv, "--no-quality")
    assert again.returncode == 0 and "0 cells to run" in again.stdout
    (out / "report.json").unlink()
    rebuilt = bench("report", str(out), "--no-quality")
    assert rebuilt.returncode == 0 and (out / "report.json").exists()
