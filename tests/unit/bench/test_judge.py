from __future__ import annotations

from sglang_specsot.bench.judge import load_judgements, pending, record
from tests.unit.bench.conftest import FAILED, cell


def test_pending_pairs_skip_judged_failed_and_unselected_cells(tmp_path):
    cells = {c.key: c for c in (cell(1, "plain"), cell(1, "SoT-server"), cell(1, "NGRAM"),
                                cell(2, "plain"), cell(2, "SoT-server", status=FAILED))}  # fmt: skip
    todo = pending(cells, ["SoT-server"], {})
    assert [(c.question_id, c.config, base.config) for c, base in todo] == [(1, "SoT-server", "plain")]
    record(tmp_path, todo[0][0], ("A", "B"))
    judged = load_judgements(tmp_path)
    assert judged == {"SoT-server": {1: "win"}}
    assert pending(cells, ["SoT-server"], judged) == []
