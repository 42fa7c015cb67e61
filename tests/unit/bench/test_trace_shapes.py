"""trace_shapes: cells and an acceptance trace joined by rid into replayable answer shapes."""

from __future__ import annotations

import json

import pytest

from sglang_specsot.bench import trace_shapes as ts
from sglang_specsot.bench.store import OK, Branch, CellResult, append
from sglang_specsot.speculative.trace import TraceStep

GROUP = "specsot-ab12"


def _cells(run):
    run.mkdir()
    path = run / "cells.jsonl"
    append(path, CellResult(3, "plain", OK, True, output_tokens=40, rid="plain-q3-x",
                            token_parts={"prompt": 30, "completion": 40}))  # fmt: skip
    append(path, CellResult(3, "SPECSOT", OK, True, output_tokens=40, rid="SPECSOT-q3-y",
                            token_parts={"prompt": 30, "completion": 40}))  # fmt: skip
    append(path, CellResult(3, "SpecSoT-server", OK, True, output_tokens=50, path="sot", rid=GROUP,
                            branches=(Branch(1, 0, 1, 14, "stop"), Branch(0, 0, 1, 12, "stop")),
                            token_parts={"skeleton_prompt": 400, "skeleton": 20, "branch_prompts": [150, 152],
                                         "branch_cached": [0, 140]}))  # fmt: skip


def _step(rid, accepted, parents=(-1, 0, 1, 2)):
    node = accepted  # a chain: node i sits at depth i
    return TraceStep(rid, 4, parents, node, accepted)


TRACE = {
    "SPECSOT-q3-y": [_step("SPECSOT-q3-y", 3), _step("SPECSOT-q3-y", 1), _step("SPECSOT-q3-y", 0)],
    f"{GROUP}-skeleton-1": [_step(f"{GROUP}-skeleton-1", 2)],
    f"{GROUP}-branch1-2": [_step(f"{GROUP}-branch1-2", 3)],
    f"{GROUP}-branch0-3": [_step(f"{GROUP}-branch0-3", 0)],
    "unrelated": [_step("unrelated", 1)],
}


def test_a_question_joins_its_cells_and_traced_rids_in_skeleton_order(tmp_path):
    _cells(tmp_path / "run")
    (shape,) = ts.build_shapes([tmp_path / "run"], TRACE)
    assert (shape.plain_tokens, shape.plain_prompt_tokens, shape.specsot_rid) == (40, 30, "SPECSOT-q3-y")
    assert (shape.skeleton_tokens, shape.skeleton_prompt_tokens, shape.skeleton_rid) == (20, 400, f"{GROUP}-skeleton-1")
    assert shape.branch_tokens == (12, 14) and shape.branch_rids == (f"{GROUP}-branch0-3", f"{GROUP}-branch1-2")
    assert (shape.branch_prefix_tokens, shape.branch_suffix_tokens) == (140, 11)


def test_p_by_depth_counts_only_steps_that_reached_the_depth():
    steps = TRACE["SPECSOT-q3-y"]  # accepted 3, 1, 0 of a 3-deep chain
    assert ts.p_by_depth(steps) == [round(2 / 3, 4), 0.5, 1.0]
    summary = ts.acceptance(TRACE)
    assert summary["normal"]["requests"] == 2 and summary["branch"]["accept_length"] == pytest.approx(2.5)


def test_write_keeps_only_the_shapes_requests(tmp_path):
    _cells(tmp_path / "run")
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(s.to_json() + "\n" for steps in TRACE.values() for s in steps))
    ts.write(tmp_path / "out", [tmp_path / "run"], [trace])
    kept = {json.loads(line)["rid"] for line in (tmp_path / "out" / "trace.jsonl").read_text().splitlines()}
    assert "unrelated" not in kept and len(kept) == 4
    assert json.loads((tmp_path / "out" / "answers.jsonl").read_text())["question_id"] == 3


def test_a_run_without_token_parts_is_refused_with_the_fix(tmp_path):
    (tmp_path / "run").mkdir()
    append(tmp_path / "run" / "cells.jsonl", CellResult(1, "plain", OK, True, output_tokens=9))
    with pytest.raises(ValueError, match="rerun it with this commit"):
        ts.build_shapes([tmp_path / "run"], {})


def test_a_folder_reads_back_as_it_was_written(tmp_path):
    shape = ts.AnswerShape(3, 40, 30, "SPECSOT-q3-y", 20, 400, f"{GROUP}-skeleton-1", (14, 12),
                           (f"{GROUP}-branch0-3", f"{GROUP}-branch1-2"), 140, 10)  # fmt: skip
    trace = {rid: TRACE[rid] for rid in ("SPECSOT-q3-y", f"{GROUP}-skeleton-1")}
    ts.write_folder(tmp_path, [shape], trace)
    assert ts.read_folder(tmp_path) == ([shape], trace)
