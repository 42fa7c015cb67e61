"""An acceptance trace: per decode step of each request, the tree its drafter proposed and the
path verify accepted, so a benchmark can replay a real model pair's acceptance on any weights
(`replay.py`).

With `SGLANG_SPECSOT_TRACE=/path/trace.jsonl` in the server's environment, every decode step
appends one JSON line per request, in batch order (a request's lines are its steps, in order):

    {"rid": "...", "width": 8, "parents": [-1, 0, 1, 0], "node": 2, "accepted": 2}

`parents` is the proposed tree unpadded (BFS order, node 0 the root, a parent precedes its
child), `width` the step's verify rows per request (the widest tree of the batch, padded to a
tier), `node` the deepest accepted node in the padded tree (0: only the bonus token; at or past
`len(parents)`, a filler of the padding) and `accepted` the drafts accepted (accept length - 1,
the depth of `node`). Off by default; on, it reads nothing from the device: the committed
tokens are already on the host, and the accepted node is found by walking the host tree.
Plain Python (no torch, no SGLang).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from sglang_specsot.speculative.draft_tree import DraftTree, pad_tree
from sglang_specsot.speculative.jsonl import JsonLinesFile

ENV = "SGLANG_SPECSOT_TRACE"


@dataclass(frozen=True)
class TraceStep:
    """One request's decode step: the shape of the tree it proposed and the path verify kept."""

    rid: str
    width: int  # verify rows per request this step (padded; >= len(parents))
    parents: tuple[int, ...]  # the proposed tree, unpadded: parents[0] == -1, parents[i] < i
    node: int  # the deepest accepted node of the padded tree (0: the bonus token alone)
    accepted: int  # drafts accepted: the depth of `node` (accept length - 1)

    def __post_init__(self) -> None:
        assert self.width >= len(self.parents) >= 1, f"a tree of {len(self.parents)} nodes in width {self.width}"
        assert 0 <= self.node < self.width, f"accepted node {self.node} outside width {self.width}"
        assert self.accepted == self.padded().depth(self.node), f"node {self.node} is not at depth {self.accepted}"

    def padded(self, width: int | None = None) -> DraftTree:
        """The tree's shape padded to `width` (default: the recorded one) as the worker pads it,
        with token i at node i (distinct, so siblings differ as tree sampling requires)."""
        tree = DraftTree(tuple(range(len(self.parents))), self.parents)
        return pad_tree(tree, self.width if width is None else width, filler=0)

    def to_json(self) -> str:
        return json.dumps({"rid": self.rid, "width": self.width, "parents": list(self.parents),
                           "node": self.node, "accepted": self.accepted})  # fmt: skip

    @classmethod
    def from_json(cls, line: str) -> TraceStep:
        d = json.loads(line)
        return cls(str(d["rid"]), int(d["width"]), tuple(d["parents"]), int(d["node"]), int(d["accepted"]))


def accepted_node(tree: DraftTree, width: int, row: Sequence[int], length: int) -> int:
    """The deepest node verify accepted in `tree` padded to `width` (as `pad_tree` with the
    root's token), found from its committed `row`: the path's draft tokens, then the bonus."""
    padded = pad_tree(tree, width, filler=tree.tokens[0])
    children = {(p, t): i for i, (p, t) in enumerate(zip(padded.parents, padded.tokens)) if i}
    node = 0
    for token in row[: length - 1]:
        node = children[(node, token)]  # siblings carry distinct tokens: one child per token
    return node


def steps_of(rids: Sequence[str], trees: Sequence[DraftTree], width: int, rows: Sequence[Sequence[int]],
             lens: Sequence[int]) -> list[TraceStep]:  # fmt: skip
    """One decode step's TraceSteps, from what the host already holds after verify."""
    out = []
    for rid, tree, row, n in zip(rids, trees, rows, lens):
        node = accepted_node(tree, width, row, n)
        out.append(TraceStep(str(rid), width, tree.parents, node, n - 1))
    return out


class TraceWriter(JsonLinesFile):
    """Appends TraceSteps as JSON lines to the file SGLANG_SPECSOT_TRACE names."""

    ENV = ENV

    def write(self, steps: Sequence[TraceStep]) -> None:
        self.write_lines(s.to_json() for s in steps)


def read_trace(path: str) -> dict[str, list[TraceStep]]:
    """A trace's steps by request, requests in order of their first step, steps in order."""
    by_rid: dict[str, list[TraceStep]] = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                step = TraceStep.from_json(line)
                by_rid.setdefault(step.rid, []).append(step)
    return by_rid
