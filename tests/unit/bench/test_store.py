from __future__ import annotations

import json

import pytest

from sglang_specsot.bench.store import FAILED, OK, append, check_run_settings, done_keys, load
from tests.unit.bench.conftest import cell, sot_cell


def test_round_trip_keeps_branches_and_properties(tmp_path):
    path = tmp_path / "cells.jsonl"
    original = sot_cell(3, "SpecSoT-server", 4.0)
    append(path, original)
    loaded = load(path)[(3, "SpecSoT-server")]
    assert loaded == original
    assert loaded.longest_branch == 2.5 and loaded.hit_cap and loaded.tokens_per_s == 10.0


def test_a_torn_last_line_is_ignored(tmp_path):
    path = tmp_path / "cells.jsonl"
    append(path, cell(1, "plain"))
    with path.open("a") as f:
        f.write('{"question_id": 2, "conf')
    assert list(load(path)) == [(1, "plain")]


def test_failed_cells_are_retried_and_never_hide_a_success(tmp_path):
    path = tmp_path / "cells.jsonl"
    append(path, cell(1, "plain", status=FAILED, reason="HTTP 500"))
    append(path, cell(2, "plain"))
    append(path, cell(2, "plain", status=FAILED, reason="late failure"))
    cells = load(path)
    assert cells[(1, "plain")].status == FAILED and cells[(2, "plain")].status == OK
    assert done_keys(cells) == {(2, "plain")}
    append(path, cell(1, "plain"))
    assert done_keys(load(path)) == {(1, "plain"), (2, "plain")}


def test_run_settings_are_written_once_and_a_mismatch_is_refused(tmp_path):
    out = tmp_path / "run"
    check_run_settings(out, {"target": "a", "max_tokens": 64})
    assert json.loads((out / "run.json").read_text())["target"] == "a"
    check_run_settings(out, {"target": "a", "max_tokens": 64})  # resuming: fine
    with pytest.raises(ValueError, match="other settings.*max_tokens"):
        check_run_settings(out, {"target": "a", "max_tokens": 128})
