"""The load test's own arithmetic and guards, without a server."""

from __future__ import annotations

import pytest

from sglang_specsot.loadtest import main
from sglang_specsot.loadtest.clients import request_body
from sglang_specsot.loadtest.fleet import memory_trend
from sglang_specsot.loadtest.tally import Outcome, Report, by_question, tally


def _entry(t_s: int, rss: float, malloc: float | None = None) -> dict:
    entry = {"t_s": t_s, "rss_mb": rss, "http_rss_mb": 900.0}
    return {**entry, "malloc": {"in_use_mb": malloc}} if malloc is not None else entry


def test_the_trend_reads_the_second_half_only():
    # Stores fill in the first half (+400 MB), then memory is flat: a slope of 0, not the average.
    timeline = [_entry(0, 1600), _entry(60, 2000)] + [_entry(t, 2000 + (t % 120 == 0)) for t in range(120, 601, 30)]
    trend = memory_trend(timeline)
    assert abs(trend["scheduler_rss_mb_per_min"]) < 0.5 and trend["http_rss_mb_per_min"] == 0.0
    assert "malloc_in_use_mb_per_min" not in trend  # an entry without the figure is skipped


def test_a_steady_climb_shows_as_its_slope():
    timeline = [_entry(t, 1000 + t / 60 * 4, malloc=500 + t / 60 * 2) for t in range(0, 1801, 30)]
    trend = memory_trend(timeline)
    assert trend["scheduler_rss_mb_per_min"] == pytest.approx(4.0)
    assert trend["malloc_in_use_mb_per_min"] == pytest.approx(2.0)
    assert memory_trend([]) == {} and memory_trend(timeline[:2]) == {}  # too few points: no slope


def test_a_server_off_this_machine_is_refused(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--url", "http://10.0.0.5:30000", "--duration", "1"])
    assert info.value.code == 2 and "loopback" in capsys.readouterr().err


def test_in_auto_mode_the_plain_requests_are_the_same_requests_sent_off():
    auto = request_body("sot", False, "Why?", "r1", "auto")
    off = request_body("plain", False, "Why?", "r2", "auto")
    assert auto["specsot"]["mode"] == "auto" and off["specsot"]["mode"] == "off"
    same = {k: v for k, v in off.items() if k not in ("specsot", "rid")}
    assert {k: v for k, v in auto.items() if k != "specsot"} == same
    assert auto["specsot"]["config"] == off["specsot"]["config"] and "rid" not in auto
    assert "specsot" not in request_body("plain", False, "Why?", "r3")  # mode "on": short plain requests
    assert request_body("sot", True, "Why?", "r4")["specsot"]["mode"] == "on"


def test_the_tally_counts_how_the_sot_requests_were_answered():
    outcomes = [
        Outcome("sot", False, None, "completed", 1.0, path="sot", tokens=200),
        Outcome("sot", False, None, "completed", 2.0, path="normal", tokens=100),
        Outcome("sot", True, None, "completed", 3.0),  # streamed: its path is not read
        Outcome("plain", False, None, "completed", 1.0, tokens=64),
    ]
    report = Report()
    tally(report, outcomes)
    assert report.sot_paths == {"sot": 1, "normal": 1} and report.latency["sot"]["n"] == 3
    assert report.tokens == {"sot": 150.0, "plain": 64.0}
    assert [(r["kind"], r["path"], r["tokens"]) for r in report.requests][:2] == [("sot", "sot", 200), ("sot", "normal", 100)]


def test_by_question_compares_the_kinds_question_by_question():
    outcomes = [
        Outcome("plain", False, None, "completed", 10.0, tokens=160, question=0),
        Outcome("plain", False, None, "completed", 14.0, tokens=140, question=0),
        Outcome("sot", False, None, "completed", 6.0, path="sot", tokens=120, question=0, gate_wait=0.5),
        Outcome("sot", False, None, "completed", 12.0, path="normal", tokens=150, question=0),
        Outcome("sot", True, None, "completed", 3.0, question=0),  # streamed: path unknown, left out
        Outcome("sot", False, None, "aborted", None, question=1),  # not completed: left out
        Outcome("plain", False, None, "completed", 2.0, tokens=9, question=4),
    ]
    table = by_question(outcomes)
    assert table["0"] == {"plain": {"n": 2, "p50_s": 12.0, "tokens": 150.0},
                          "sot:normal": {"n": 1, "p50_s": 12.0, "tokens": 150.0},
                          "sot:sot": {"n": 1, "p50_s": 6.0, "tokens": 120.0, "gate_wait_p50_s": 0.5}}
    assert list(table) == ["0", "4"]
