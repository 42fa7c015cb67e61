"""Two trace folders of the same answers compared step for step: does the teacher-forced trace
(`bench teacher-trace`) accept what a served run (`bench e2e --trace` + `bench trace-shapes`)
accepted?

Both folders hold answers.jsonl (AnswerShape lines) and trace.jsonl (TraceStep lines). A
question's parts (its normal answer, its skeleton, each branch) are joined by question id and
role, not by rid: the teacher names its requests itself. Two traces of one answer start a step
at the same committed position until their accept lengths first differ; after that they may
fall back into step. So the comparison is per committed position: at every position where
both start a step, are the drafts accepted the same? With a greedy target and a greedy draft
they must be, up to the draft's rounding (the served draft runs in the server's dtype, the
teacher's in float32): a position where they differ is a near-tie of the draft's logits, or a
bug in one of the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_specsot.bench.trace_shapes import AnswerShape, read_folder
from sglang_specsot.speculative.trace import TraceStep


@dataclass(frozen=True, slots=True)
class PartComparison:
    """One part of one answer in both traces; `agree` of `shared` step-start positions."""

    question_id: int
    part: str  # "normal", "skeleton" or "branch<i>"
    steps_a: int
    steps_b: int
    shared: int
    agree: int
    first_difference: int | None  # the committed position of the first disagreement


def accepted_at(steps: Sequence[TraceStep]) -> dict[int, int]:
    """{committed tokens before the step: drafts it accepted}; each step commits accepted + 1."""
    at, position = {}, 0
    for step in steps:
        at[position] = step.accepted
        position += step.accepted + 1
    return at


def compare_part(question_id: int, part: str, a: Sequence[TraceStep], b: Sequence[TraceStep]) -> PartComparison:
    at_a, at_b = accepted_at(a), accepted_at(b)
    shared = sorted(at_a.keys() & at_b.keys())
    differ = [p for p in shared if at_a[p] != at_b[p]]
    return PartComparison(question_id, part, len(a), len(b), len(shared), len(shared) - len(differ),
                          differ[0] if differ else None)  # fmt: skip


def part_rids(shape: AnswerShape) -> dict[str, str]:
    """{part: rid} of one answer's shape; parts traced under no rid are left out."""
    rids = {"normal": shape.specsot_rid, "skeleton": shape.skeleton_rid}
    rids.update({f"branch{i}": rid for i, rid in enumerate(shape.branch_rids)})
    return {part: rid for part, rid in rids.items() if rid}


def _folder(folder: Path) -> tuple[dict[int, dict[str, str]], dict[str, list[TraceStep]]]:
    shapes, trace = read_folder(folder)
    return {s.question_id: part_rids(s) for s in shapes}, trace


def compare(a: Path, b: Path) -> list[PartComparison]:
    """Every part traced in both folders (same question, same role), in question order."""
    (rids_a, trace_a), (rids_b, trace_b) = _folder(a), _folder(b)
    out = []
    for qid in sorted(rids_a.keys() & rids_b.keys()):
        for part, rid_a in rids_a[qid].items():
            rid_b = rids_b[qid].get(part)
            if rid_b and rid_a in trace_a and rid_b in trace_b:
                out.append(compare_part(qid, part, trace_a[rid_a], trace_b[rid_b]))
    if not out:
        raise ValueError(f"{a} and {b} share no traced answer part: are they traces of the same run's answers?")
    return out


def summary(parts: Sequence[PartComparison]) -> str:
    shared, agree = sum(p.shared for p in parts), sum(p.agree for p in parts)
    lines = [f"{p.question_id:>5} {p.part:<9} steps {p.steps_a:>4} / {p.steps_b:<4} same accept at "
             f"{p.agree}/{p.shared} shared positions" + ("" if p.first_difference is None else
             f" (first difference at token {p.first_difference})") for p in parts]  # fmt: skip
    lines.append(f"all: {agree}/{shared} shared step positions accept the same ({agree / max(shared, 1):.1%})")
    return "\n".join(lines)
