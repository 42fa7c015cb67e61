"""The keep-vs-spread benchmark's summary: ratios paired by question and repeat."""

from __future__ import annotations

from sglang_specsot.bench.dp_placement import summary
from sglang_specsot.sot.latency import RowCosts


def _row(c: int, repeat: int, question: int, placement: str, seconds: float, tokens: int = 100) -> dict:
    ranks = [0, 1] if placement == "spread" else [question % 2]
    return {"concurrency": c, "repeat": repeat, "question": question, "placement": placement,
            "seconds": seconds, "tokens": tokens, "ranks": ranks}  # fmt: skip


def test_the_ratio_is_keep_over_spread_per_pair_and_an_unpaired_answer_is_left_out():
    rows = [_row(1, 0, 0, "keep", 12.0), _row(1, 0, 0, "spread", 10.0),
            _row(1, 0, 1, "keep", 9.0), _row(1, 0, 1, "spread", 10.0),
            _row(1, 1, 0, "keep", 30.0, tokens=300), _row(1, 1, 0, "spread", 10.0),
            _row(1, 1, 1, "keep", 8.0)]  # fmt: skip
    table = summary(rows)
    line = table.splitlines()[2]
    # pairs 1.2, 0.9, 3.0: median 1.2; the lone keep answer of repeat 1 is no pair
    assert line.startswith("| 1 | 3 | 1.20x | - |"), table
    assert "| 150 / 100 |" in line and line.endswith("| 2.0 |")


def test_the_prediction_prices_each_spread_answer_with_the_others_running_at_once():
    costs = RowCosts((1, 4, 8), (197.0, 677.0, 1355.0))  # linear rows: spreading pays alone
    rows = []
    for c in (1, 4):
        for placement in ("keep", "spread"):
            row = _row(c, 0, 0, placement, 10.0)
            rows.append(row | {"branch_tokens": [40, 40, 40, 40], "branch_prompt": 150})
    lines = summary(rows, costs, ranks=2).splitlines()[2:]
    alone, busy = (float(line.split("|")[4].strip().rstrip("x")) for line in lines)
    assert alone > 1.2 and busy < 1.0
