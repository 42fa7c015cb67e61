"""Replaying an acceptance trace (`trace.py`): a benchmark tool, not a way to serve.

With `SGLANG_SPECSOT_REPLAY=/path/trace.jsonl` and `SGLANG_SPECSOT_REPLAY_OPT_IN=forced-acceptance`
in the server's environment, each decode step drafts, for each request, a tree of the shape its
recorded request proposed at that step, and verify accepts the recorded path, whatever the
weights say (`drafters/replay.py`), so a GPU runs the real widths and accepted lengths of a real
model pair on random weights, as SGLang's `SGLANG_SIMULATE_ACC_LEN` does for its own
algorithms. SoT-context drafting takes the recorded trees; a draft model or EAGLE head drafts
its own within the recorded sizes and has the recorded accept length forced along its own
tree, so its draft-extend runs on its own accepted tokens. The outputs are not the model's tokens (nor greedy, nor sampled from it): that is
why the mode needs its opt-in. A new request replays the recorded request of its own rid where
the trace has one, else the first recorded request no other has claimed; once its steps run
out, or where none is left, it decodes plainly (width 1). A rid `X@tag` (REPEAT_SEP) that is
not itself recorded replays recorded request X again, however often X was replayed (and nothing,
decoding plainly, where X is not recorded either: never another's steps), so a benchmark can send
each recorded request in a warm-up pass and in measured passes (each with its own tag, since
SGLang refuses two live requests of one rid). Send each request at least its recorded length
(`ignore_eos`) to replay all of it. Plain Python (no torch, no SGLang).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence

from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.trace import TraceStep, read_trace

ENV = "SGLANG_SPECSOT_REPLAY"
OPT_IN_ENV = "SGLANG_SPECSOT_REPLAY_OPT_IN"
OPT_IN = "forced-acceptance"
REPEAT_SEP = "@"  # `X@tag` replays recorded request X again (a benchmark's repeated passes)


class TraceReplay:
    """Hands each live request the next recorded step of the recorded request it replays."""

    def __init__(self, trace: dict[str, list[TraceStep]], window: int) -> None:
        widest = max((len(s.parents) for steps in trace.values() for s in steps), default=1)
        if widest > window:
            raise ValueError(
                f"{ENV}: the trace has a tree of {widest} nodes, wider than this server's verify window "
                f"of {window} (--speculative-num-draft-tokens); start the server with at least {widest}"
            )
        self.trace = trace
        self.unclaimed = deque(trace)  # recorded rids not yet replayed, in trace order
        self.claims: dict[str, deque[TraceStep]] = {}  # live rid -> its recorded steps still to come

    @classmethod
    def from_env(cls, window: int) -> TraceReplay | None:
        path = os.environ.get(ENV)
        if not path:
            return None
        if os.environ.get(OPT_IN_ENV) != OPT_IN:
            raise ValueError(
                f"{ENV}={path!r} forces verify to accept the trace's paths, so outputs are not the model's "
                f"tokens (a speed benchmark only); set {OPT_IN_ENV}={OPT_IN} to run it anyway"
            )
        return cls(read_trace(path), window)

    def next_steps(self, rids: Sequence[str]) -> list[TraceStep | None]:
        """Each request's recorded step for this decode step (None: decode plainly)."""
        return [self._next(rid) for rid in rids]

    def _next(self, rid: str) -> TraceStep | None:
        if rid not in self.claims:
            self.claims[rid] = deque(self._claim(rid))
        steps = self.claims[rid]
        return steps.popleft() if steps else None

    def _claim(self, rid: str) -> list[TraceStep]:
        recorded = repeated_rid(rid, self.trace)
        if recorded is not None:  # `X@tag`: X again, whoever replayed it before (none: plain)
            if recorded in self.unclaimed:
                self.unclaimed.remove(recorded)
            return self.trace.get(recorded, [])
        if rid in self.unclaimed:  # the recorded request of the same rid
            self.unclaimed.remove(rid)
            return self.trace[rid]
        return self.trace[self.unclaimed.popleft()] if self.unclaimed else []

    def forget(self, rid: str) -> None:
        self.claims.pop(rid, None)


def repeated_rid(rid: str, trace: dict[str, list[TraceStep]]) -> str | None:
    """The rid `X` that a rid `X@tag` repeats (split at its last REPEAT_SEP; X may be missing
    from `trace`), or None where `rid` is itself recorded or has no REPEAT_SEP."""
    recorded, sep, _ = rid.rpartition(REPEAT_SEP)
    return None if rid in trace or not sep else recorded


def replayed_tree(step: TraceStep | None, root: int) -> DraftTree:
    """A tree of the recorded shape under `root`: node i carries token i (siblings differ, as
    tree sampling requires; any token serves, acceptance is forced)."""
    if step is None:
        return DraftTree((root,), (-1,))
    return DraftTree((root, *range(1, len(step.parents))), step.parents)
