"""trace_compare: two traces of the same answers joined by question and role, compared at every
committed position where both start a step."""

from __future__ import annotations

import pytest

from sglang_specsot.bench import trace_compare as tc
from sglang_specsot.bench.trace_shapes import AnswerShape, write_folder
from sglang_specsot.speculative.trace import TraceStep

CHAIN = (-1, 0, 1, 2, 3)


def _steps(rid, accepted):
    return [TraceStep(rid, 5, CHAIN, a, a) for a in accepted]


def _folder(path, normal_rid, normal, skeleton_rid=None, skeleton=(), branch_rids=(), branches=()):
    shape = AnswerShape(7, 40, 30, normal_rid, 20 if skeleton_rid else 0, 0, skeleton_rid,
                        tuple(10 for _ in branch_rids), tuple(branch_rids))  # fmt: skip
    trace = {normal_rid: _steps(normal_rid, normal)}
    if skeleton_rid:
        trace[skeleton_rid] = _steps(skeleton_rid, skeleton)
    for rid, accepted in zip(branch_rids, branches):
        trace[rid] = _steps(rid, accepted)
    write_folder(path, [shape], trace)
    return path


def test_accepted_at_keys_steps_by_the_tokens_committed_before_them():
    assert tc.accepted_at(_steps("r", [2, 0, 4])) == {0: 2, 3: 0, 4: 4}


def test_equal_traces_agree_everywhere_whatever_their_rids(tmp_path):
    a = _folder(tmp_path / "a", "served-x", [2, 0, 4], "specsot-1-skeleton-1", [1, 1], ["specsot-1-branch0-2"], [[3]])
    b = _folder(tmp_path / "b", "q7-normal", [2, 0, 4], "specsot-70-skeleton-1", [1, 1], ["specsot-70-branch0-2"], [[3]])
    parts = tc.compare(a, b)
    assert [(p.part, p.shared, p.agree, p.first_difference) for p in parts] == [
        ("normal", 3, 3, None), ("skeleton", 2, 2, None), ("branch0", 1, 1, None)]
    assert "6/6 shared step positions" in tc.summary(parts)


def test_a_difference_is_found_and_the_traces_fall_back_into_step(tmp_path):
    # a: positions 0, 3, 4, 9; b accepts one fewer at 3: positions 0, 3, 4, 5, 9 -> shared 0, 3, 4, 9
    a = _folder(tmp_path / "a", "x", [2, 0, 4, 1])
    b = _folder(tmp_path / "b", "y", [2, 0, 0, 3, 1])
    (part,) = tc.compare(a, b)
    assert (part.steps_a, part.steps_b, part.shared, part.agree, part.first_difference) == (4, 5, 4, 3, 4)


def test_folders_without_a_shared_part_or_files_are_refused(tmp_path):
    a = _folder(tmp_path / "a", "x", [1])
    b = _folder(tmp_path / "b", "y", [1], "sk", [1])
    (tmp_path / "b" / "answers.jsonl").write_text((tmp_path / "b" / "answers.jsonl").read_text().replace('"question_id": 7', '"question_id": 8'))
    with pytest.raises(ValueError, match="share no traced answer part"):
        tc.compare(a, b)
    with pytest.raises(ValueError, match="has no answers.jsonl"):
        tc.compare(a, tmp_path / "missing")
