"""A real model pair's acceptance and answer shapes, compact, for replay on any device.

An e2e run with `SGLANG_SPECSOT_TRACE` on its SPECSOT server leaves, beside its cells, one trace
line per request per decode step (speculative/trace.py). This joins the two by rid (each cell
records its server rid; a SoT answer's generations are "specsot-<group>-<role>-<n>") into one
`AnswerShape` per question:

- the normal answer: its prompt and generated tokens on the plain server, and the rid of the
  same question's traced normal answer on the SPECSOT server;
- the SoT answer on the SPECSOT server: skeleton prompt and tokens, each point's generated
  tokens, the branches' shared prompt prefix and own suffix, and the traced rids of the skeleton
  and of each point's branch.

`answers.jsonl` (one shape a line) and the trace are what the device's replay stage
(scripts/gpu_stage_replay.py) reads; `acceptance` summarises the trace per role. Plain Python.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_specsot.bench.store import OK, CellResult, load
from sglang_specsot.speculative.trace import TraceStep, read_trace

ANSWERS_FILE, TRACE_FILE = "answers.jsonl", "trace.jsonl"
PLAIN_CONFIG, SPECSOT_CONFIG, SPECSOT_SOT_CONFIG = "plain", "SPECSOT", "SpecSoT-server"
_SOT_RID = re.compile(r"^specsot-(?P<group>[0-9a-f]+)-(?P<role>[a-z]+)(?P<point>\d*)-(?P<n>\d+)$")


@dataclass(frozen=True, slots=True)
class AnswerShape:
    """One question's answers in tokens, with the traced rids that replay their acceptance.

    Invariant: `branch_tokens` and `branch_rids` are in skeleton order, one per point that ran
    (a point whose branch was traced under no rid has ""), and a SoT field is 0 / None / empty
    where the question has no SoT answer."""

    question_id: int
    plain_tokens: int
    plain_prompt_tokens: int
    specsot_rid: str | None  # the traced normal answer on the SPECSOT server
    skeleton_tokens: int = 0
    skeleton_prompt_tokens: int = 0
    skeleton_rid: str | None = None
    branch_tokens: tuple[int, ...] = ()
    branch_rids: tuple[str, ...] = ()
    branch_prefix_tokens: int = 0  # the branches' shared prompt (question and skeleton), prefilled once
    branch_suffix_tokens: int = 0  # each branch's own last line of prompt (median)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: str) -> AnswerShape:
        fields = json.loads(line)
        return cls(**{**fields, "branch_tokens": tuple(fields["branch_tokens"]),
                      "branch_rids": tuple(fields["branch_rids"])})  # fmt: skip


def sot_rids(trace_rids: Iterable[str], group_rid: str) -> tuple[str | None, dict[int, str]]:
    """(the skeleton's rid, {point: its branch's first rid}) of one SoT answer's group, from the
    rids a trace holds ("specsot-<group>-skeleton-1", "specsot-<group>-branch3-5", ...)."""
    skeleton, branches = None, {}
    for rid in trace_rids:
        if not rid.startswith(group_rid + "-"):
            continue
        match = _SOT_RID.match(rid)
        if match is None:
            continue
        role, point = match["role"], match["point"]
        if role == "skeleton" and skeleton is None:
            skeleton = rid
        elif role == "branch" and point and int(point) not in branches:
            branches[int(point)] = rid  # a retried point's second rid continues the same branch
    return skeleton, branches


def answer_shape(plain: CellResult, specsot: CellResult | None, sot: CellResult | None,
                 trace_rids: Sequence[str]) -> AnswerShape:  # fmt: skip
    """One question's shape from its plain, SPECSOT and SpecSoT-server cells."""
    parts = plain.token_parts or {}
    if not parts.get("prompt"):
        raise ValueError(f"q{plain.question_id}: the plain cell records no prompt tokens (a run before "
                         "bench cells kept token_parts); rerun it with this commit")  # fmt: skip
    traced = specsot.rid if specsot is not None and specsot.rid in trace_rids else None
    shape = AnswerShape(plain.question_id, plain.output_tokens, parts["prompt"], traced)
    sot_parts = (sot.token_parts or {}) if sot is not None and sot.path == "sot" else {}
    if not sot_parts:
        return shape
    skeleton_rid, branch_rids = sot_rids(trace_rids, sot.rid)
    by_point = {b.index: b.tokens for b in sot.branches}
    points = sorted(by_point)
    prompts = [p for p in sot_parts.get("branch_prompts") or [] if p]
    cached = [c for c in sot_parts.get("branch_cached") or [] if c]
    prefix = min(cached) if cached else 0
    return AnswerShape(
        **{**asdict(shape), "skeleton_tokens": sot_parts.get("skeleton") or 0,
           "skeleton_prompt_tokens": sot_parts.get("skeleton_prompt") or 0, "skeleton_rid": skeleton_rid,
           "branch_tokens": tuple(by_point[p] for p in points),
           "branch_rids": tuple(branch_rids.get(p, "") for p in points),
           "branch_prefix_tokens": prefix,
           "branch_suffix_tokens": int(statistics.median(prompts)) - prefix if prompts else 0},
    )  # fmt: skip


def build_shapes(runs: Sequence[Path], trace: Mapping[str, list[TraceStep]]) -> list[AnswerShape]:
    """Every question with an ok plain cell in `runs` (later runs add configurations), in
    question order."""
    cells: dict[tuple[int, str], CellResult] = {}
    for run in runs:
        cells.update({k: c for k, c in load(run / "cells.jsonl").items() if c.status == OK})
    rids = list(trace)
    qids = sorted(q for q, config in cells if config == PLAIN_CONFIG)
    return [answer_shape(cells[(q, PLAIN_CONFIG)], cells.get((q, SPECSOT_CONFIG)), cells.get((q, SPECSOT_SOT_CONFIG)),
                         rids) for q in qids]  # fmt: skip


def role_of(rid: str) -> str:
    """"skeleton", "branch" or "normal": which kind of generation a traced rid was."""
    match = _SOT_RID.match(rid)
    return match["role"] if match and match["role"] in ("skeleton", "branch") else "normal"


def acceptance(trace: Mapping[str, list[TraceStep]]) -> dict[str, dict]:
    """Per role: steps, mean accept length (1 + drafts accepted), mean tree size, and p by
    depth (the share of steps that accepted depth d among those that accepted d - 1 and
    proposed a node at depth d)."""
    out = {}
    for role in ("normal", "skeleton", "branch"):
        steps = [s for rid, ss in trace.items() if role_of(rid) == role for s in ss]
        if steps:
            out[role] = {"requests": sum(role_of(r) == role for r in trace), "steps": len(steps),
                         "accept_length": 1 + statistics.fmean(s.accepted for s in steps),
                         "tree_nodes": statistics.fmean(len(s.parents) for s in steps),
                         "p_by_depth": p_by_depth(steps)}  # fmt: skip
    return out


def p_by_depth(steps: Sequence[TraceStep]) -> list[float]:
    """P(accept depth d | accepted d - 1, the tree reaches d), d = 1, 2, ... while reached."""
    out, depth = [], 1
    while True:
        reached = [s for s in steps if s.accepted >= depth - 1 and _tree_depth(s) >= depth]
        if not reached:
            return out
        out.append(round(sum(s.accepted >= depth for s in reached) / len(reached), 4))
        depth += 1


def _tree_depth(step: TraceStep) -> int:
    tree = step.padded(len(step.parents))
    return max(tree.depth(i) for i in range(len(step.parents)))


def write(out: Path, runs: Sequence[Path], trace_paths: Sequence[Path]) -> dict:
    """answers.jsonl and trace.jsonl (the traces joined, only requests of the shapes' rids) in
    `out`; returns the acceptance summary, also written as acceptance.json."""
    trace: dict[str, list[TraceStep]] = {}
    for path in trace_paths:
        trace.update(read_trace(str(path)))
    shapes = build_shapes(runs, trace)
    keep = {r for s in shapes for r in (s.specsot_rid, s.skeleton_rid, *s.branch_rids) if r}
    return write_folder(out, shapes, {rid: steps for rid, steps in trace.items() if rid in keep})


def write_folder(out: Path, shapes: Sequence[AnswerShape], trace: Mapping[str, list[TraceStep]]) -> dict:
    """A trace folder: answers.jsonl (one shape a line), trace.jsonl (each request's steps in
    order) and acceptance.json, whose summary is returned."""
    out.mkdir(parents=True, exist_ok=True)
    (out / ANSWERS_FILE).write_text("".join(s.to_json() + "\n" for s in shapes))
    (out / TRACE_FILE).write_text("".join(step.to_json() + "\n" for steps in trace.values() for step in steps))
    summary = acceptance(trace)
    (out / "acceptance.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def read_folder(folder: Path) -> tuple[list[AnswerShape], dict[str, list[TraceStep]]]:
    """A trace folder as `write_folder` wrote it: its answer shapes and its steps by rid."""
    for name in (ANSWERS_FILE, TRACE_FILE):
        if not (folder / name).is_file():
            raise ValueError(f"{folder} has no {name}: pass a folder written by bench teacher-trace or trace-shapes")
    shapes = [AnswerShape.from_json(line) for line in (folder / ANSWERS_FILE).read_text().splitlines() if line.strip()]
    return shapes, read_trace(str(folder / TRACE_FILE))
