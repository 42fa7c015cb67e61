"""examples/step_log_report.py: the summary of a SPECSOT step log."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[3] / "examples" / "step_log_report.py"
_spec = importlib.util.spec_from_file_location("step_log_report", _PATH)
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def _step(bs, width, accepted, ms, expected=None, source="extend", explored=False, p=0.8):
    drafted = [width - 1] * bs
    return {"bs": bs, "width": width, "accepted": accepted, "drafted": drafted, "step_ms": ms,
            "expected_ms": expected, "draft_source": source, "explored": explored, "ps": [p] * bs,
            "cost": {"target_overhead_ms": 1.0}}  # fmt: skip


def test_summary_splits_plain_from_drafting_steps_per_batch_size():
    records = [_step(1, 1, [0], 100.0, 90.0, p=0.3), _step(1, 1, [0], 100.0, 90.0, p=0.3),
               _step(1, 4, [3], 200.0, 150.0, source="catch_up"), _step(1, 1, [0], 100.0, p=0.3),
               _step(3, 2, [1, 0, 1], 120.0)]  # fmt: skip
    out = report.summarise(records)
    assert list(out) == ["1", "2-4"]
    one = out["1"]
    assert one["steps"] == 4 and one["plain_share"] == 0.75
    assert one["tokens_per_step"] == (1 + 1 + 4 + 1) / 4
    assert one["tok_per_s"] == round(7 / 500 * 1e3, 2) and one["plain_steps_tok_per_s"] == 10.0
    assert one["plain_ms"] == 100.0 and one["plain_expected_ms"] == 90.0
    assert one["drafting_ms_by_source"] == {"catch_up": 200.0} and one["accepted_per_draft"] == 1.0
    assert one["mean_p_plain"] == 0.3 and one["mean_p_drafting"] == 0.8
    assert one["plain_run_lengths"] == {"runs": 2, "median": 1.5, "max": 2}
    assert out["2-4"]["accepted_per_draft"] == round(2 / 3, 3)
    assert one["plain_phase_ms"] is None  # a log without phase times
    assert one["mean_first_plain"] is None  # nor first-draft estimates
    records[2]["firsts"] = [0.25]
    assert report.summarise(records)["1"]["mean_first_drafting"] == 0.25


def test_summary_averages_each_phase_of_plain_and_drafting_steps():
    plain = [_step(2, 1, [0, 0], 100.0), _step(2, 1, [0, 0], 120.0)]
    plain[0]["phase_ms"] = {"draft": 2.0, "verify": 90.0, "target_forward": 80.0, "draft_extend": 8.0}
    plain[1]["phase_ms"] = {"draft": 4.0, "verify": 110.0, "target_forward": 100.0, "draft_extend": 6.0}
    drafting = _step(2, 3, [1, 2], 300.0)
    drafting["phase_ms"] = {"draft": 50.0, "verify": 150.0, "target_forward": 140.0, "draft_extend": 100.0}
    out = report.summarise([*plain, drafting])["2-4"]
    assert out["plain_phase_ms"] == {"draft": 3.0, "verify": 100.0, "target_forward": 90.0, "draft_extend": 7.0}
    assert out["drafting_phase_ms"]["draft_extend"] == 100.0


def test_main_reads_a_log_and_refuses_an_empty_one(tmp_path, capsys):
    log = tmp_path / "steps.jsonl"
    log.write_text(json.dumps(_step(1, 1, [0], 50.0)) + "\n")
    report.main([str(log)])
    assert json.loads(capsys.readouterr().out)["1"]["steps"] == 1
    log.write_text("")
    with pytest.raises(SystemExit, match="no steps logged"):
        report.main([str(log)])
