from __future__ import annotations

import pytest

from sglang_specsot.bench.judge import Reply, first_token_margin, load_judgements, pending, record
from tests.unit.bench.conftest import FAILED, cell


def test_pending_pairs_skip_judged_failed_and_unselected_cells(tmp_path):
    cells = {c.key: c for c in (cell(1, "plain"), cell(1, "SoT-server"), cell(1, "NGRAM"),
                                cell(2, "plain"), cell(2, "SoT-server", status=FAILED))}  # fmt: skip
    todo = pending(cells, ["SoT-server"], {})
    assert [(c.question_id, c.config, base.config) for c, base in todo] == [(1, "SoT-server", "plain")]
    record(tmp_path, todo[0][0], (Reply("A", 0.5), Reply("A", 2.5)))
    assert load_judgements(tmp_path) == {"SoT-server": {1: "tie"}}  # the words disagree
    assert load_judgements(tmp_path, "calibrated") == {"SoT-server": {1: "loss"}}  # (0.5 - 2.5) / 2 = -1
    assert pending(cells, ["SoT-server"], load_judgements(tmp_path)) == []


def test_rows_from_before_calibration_are_pending_for_it(tmp_path):
    (tmp_path / "judge.jsonl").write_text(
        '{"question_id": 1, "config": "SoT-server", "sot_first": "A", "normal_first": "A", "verdict": "tie"}\n')
    assert load_judgements(tmp_path) == {"SoT-server": {1: "tie"}}
    assert load_judgements(tmp_path, "calibrated") == {}


def test_first_token_margin_reads_sglangs_token_ids_logprobs():
    meta = {"output_token_ids_logprobs": [[(-0.2, 32, None), (-1.9, 33, None)], [(-5.0, 32, None), (-6.0, 33, None)]]}
    assert first_token_margin(meta, (32, 33)) == pytest.approx(1.7)
    assert first_token_margin({}, (32, 33)) is None
    assert first_token_margin({"output_token_ids_logprobs": [[(-0.2, 32, None)]]}, (32, 33)) is None
