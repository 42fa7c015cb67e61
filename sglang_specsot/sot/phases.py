"""What flows between the phases of one SoT answer: requests, results, one dataclass per phase.

Filled by `sot.runner.run_sot` (server) and the frontend program alike; `SoTAnswer.trace()`
is the JSON summary both report.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_specsot.sot.latency import LatencyDecision
from sglang_specsot.sot.loops import find_loop
from sglang_specsot.sot.merge import MergedAnswer
from sglang_specsot.sot.opening import Opening
from sglang_specsot.sot.planner import BranchPlan
from sglang_specsot.sot.router import RouteDecision
from sglang_specsot.sot.skeleton import SkeletonParse
from sglang_specsot.sot.tag import SoTTag

SOT, NORMAL = "sot", "normal"  # the path that answered


@dataclass(frozen=True, slots=True)
class GenRequest:
    """One generation the runner needs: prompt text (assistant pre-fill included) and budget."""

    prompt: str
    max_new_tokens: int | None  # None only for the plain answer: the backend's own default
    tag: SoTTag
    prefill: str = ""  # the tail of `prompt` that pre-fills the assistant turn
    logit_processor: str | None = None
    # End the generation once its text loops (sot.loops.LoopWatch); a backend that cannot
    # watch its text as it decodes leaves the loop to the merge, which cuts it.
    stop_on_loop: bool = False
    # Once this many tokens are generated, end at the first complete sentence (sot.finish):
    # a point held near its aimed length without being cut. None: run to EOS or the budget.
    # A backend that cannot watch its text as it decodes leaves it to the budget.
    end_after: int | None = None
    # Read the first line as it decodes (sot.opening.OpeningWatch, this many characters at
    # most) and end the generation there where it announces a list (finish reason
    # "opening", the intro line kept); prose runs on. None: no watch.
    read_opening: int | None = None


@dataclass(frozen=True, slots=True)
class GenResult:
    """What a backend returns for one GenRequest."""

    text: str  # generated text only (no prompt, no pre-fill)
    prompt_tokens: int
    completion_tokens: int
    # "stop" | "length" | "abort" | "loop" (stop_on_loop) | "aim" (end_after) | "opening" (read_opening)
    finish_reason: str
    # Verify forwards the generation took (SGLang's `spec_verify_ct`); 0 on a server that does
    # not speculate. completion_tokens / verify_steps is SGLang's `spec_accept_length`.
    verify_steps: int = 0
    # Prompt tokens the radix cache already held (SGLang's `cached_tokens`): for a branch,
    # whether the shared prefix was prefilled once or again for every branch.
    cached_tokens: int = 0
    # The data-parallel rank the generation was pinned to (serving/dp_placement.py); None
    # where the server has one rank, or SGLang chose.
    dp_rank: int | None = None

    @classmethod
    def from_meta(cls, text: str, meta: dict, finish_reason: str) -> GenResult:
        """A result from SGLang's `meta_info` for one generation."""
        return cls(text, meta.get("prompt_tokens", 0), meta.get("completion_tokens", 0), finish_reason,
                   meta.get("spec_verify_ct") or 0, meta.get("cached_tokens") or 0)  # fmt: skip


def ended_by(result: GenResult) -> str:
    """Why a generation ended: "loop" when its text ends repeating itself (whatever stopped
    it), else "budget" (its token cap), "stop", "aim" (a sentence ended past `end_after`) or
    "abort"."""
    if find_loop(result.text) is not None:
        return "loop"
    return {"length": "budget"}.get(result.finish_reason, result.finish_reason)


class GenerationAborted(RuntimeError):
    """The server aborted a generation (SGLang's finish reason "abort").

    `status_code` is the HTTP status SGLang gave the abort (503 for a scheduler out of
    memory, 500 for an internal error); None for a graceful abort (`/abort_request`, a
    disconnect), which SGLang's own chat route ends with finish_reason "abort".
    """

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class SoTPhaseError(RuntimeError):
    """A generation of one phase failed; `cause` is the backend's exception."""

    def __init__(self, phase: str, cause: BaseException) -> None:
        super().__init__(f"SoT {phase} failed: {cause}")
        self.phase = phase
        self.cause = cause


# -- phase results ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RoutePhase:
    decision: RouteDecision
    seconds: float
    # The latency model's verdict where it priced the answer (mode "auto" on a server; set by
    # runner.priced_route): SoT's and the normal answer's predicted times and why.
    latency: LatencyDecision | None = None
    # Seconds the answer waited for an SoT slot (serving/gate.py, `max_groups`) after its route
    # chose SoT: under load, where an admitted answer's latency goes before its skeleton starts.
    gate_wait: float = 0.0


@dataclass(frozen=True, slots=True)
class SkeletonPhase:
    request: GenRequest
    result: GenResult
    parse: SkeletonParse
    seconds: float  # generation
    parse_seconds: float
    # The question's own enumerated items are the plan (sot.asks.derived_parse): `request`
    # was never sent and `result` holds the points, at no tokens.
    derived: bool = False

    @property
    def text(self) -> str:
        """The skeleton as the model wrote it, its pre-filled start included."""
        return self.request.prefill + self.result.text


@dataclass(frozen=True, slots=True)
class BranchResult:
    index: int  # 0-based skeleton position
    point: str
    request: GenRequest
    result: GenResult
    started: float  # seconds after the branch phase began
    finished: float
    # The first answer of a branch that was asked again (it wrote only its point's title);
    # `request` and `result` are then the second one's.
    first_try: GenResult | None = None

    @property
    def ended(self) -> str:
        """Why the branch ended: "loop" (its tail repeats), "budget", "stop", "aim" or "abort"."""
        return ended_by(self.result)


@dataclass(frozen=True, slots=True)
class BranchesPhase:
    plan: BranchPlan
    results: tuple[BranchResult, ...]  # skeleton order
    start_order: tuple[int, ...]  # skeleton indices in the order their branches started
    peak_running: int  # most branches running at once (never above plan.max_running)
    seconds: float


@dataclass(frozen=True, slots=True)
class MergePhase:
    merged: MergedAnswer
    seconds: float


@dataclass(frozen=True, slots=True)
class OpeningPhase:
    """The normal answer's first line, read beside the skeleton (sot.opening). Where it
    announced a list, `result` is the generation stopped there (its text the intro line, its
    tokens all it decoded); where it was prose, that generation went on as the normal answer
    (`SoTAnswer.normal`) and `result` is None."""

    opening: Opening
    result: GenResult | None
    seconds: float  # until the verdict's generation returned

    @property
    def lead(self) -> str:
        """What the SoT answer writes before its points: the intro line and a blank line."""
        intro = self.result.text.strip() if self.result is not None else ""
        return intro + "\n\n" if intro else ""


@dataclass(frozen=True, slots=True)
class NormalPhase:
    request: GenRequest
    result: GenResult
    seconds: float


@dataclass(frozen=True, slots=True)
class SoTAnswer:
    """The whole answer with every phase that ran; `path` says whether SoT answered."""

    group: str
    path: str  # "sot" | "normal"
    reason: str  # why this path: the router's reason, or the skeleton parse's
    answer: str
    route: RoutePhase
    skeleton: SkeletonPhase | None = None  # None when the router chose a normal answer
    branches: BranchesPhase | None = None  # set exactly when path == "sot"
    merge: MergePhase | None = None
    normal: NormalPhase | None = None  # set exactly when path == "normal"
    seconds: float = 0.0
    opening: OpeningPhase | None = None  # where the normal answer's first line was read

    @property
    def results(self) -> tuple[GenResult, ...]:
        """Every generation of this answer (skeleton, branches, normal answer)."""
        out = [self.skeleton.result] if self.skeleton else []
        out += [self.opening.result] if self.opening is not None and self.opening.result is not None else []
        for branch in self.branches.results if self.branches else ():
            out += [branch.first_try, branch.result] if branch.first_try else [branch.result]
        out += [self.normal.result] if self.normal else []
        return tuple(out)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.results)

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.results)

    @property
    def accept_length(self) -> float | None:
        """Tokens per verify forward over the generations that were speculated (SGLang's
        `spec_accept_length` for the whole answer); None when none was."""
        speculated = [r for r in self.results if r.verify_steps]
        if not speculated:
            return None
        return sum(r.completion_tokens for r in speculated) / sum(r.verify_steps for r in speculated)

    @property
    def finish_reason(self) -> str:
        """"length" when a branch or the normal answer was cut by its budget, else "stop"."""
        parts = [b.result for b in self.branches.results] if self.branches else []
        parts += [self.normal.result] if self.normal else []
        return "length" if any(r.finish_reason == "length" for r in parts) else "stop"

    def trace(self) -> dict:
        """A JSON-safe summary of every phase, with per-phase seconds."""
        return _trace(self)


# -- trace ---------------------------------------------------------------------------------


def _gen_trace(result: GenResult) -> dict:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "finish_reason": result.finish_reason,
        "ended": ended_by(result),
        "spec_verify_ct": result.verify_steps,
        "cached_tokens": result.cached_tokens,
    } | ({"dp_rank": result.dp_rank} if result.dp_rank is not None else {})


def _trace(answer: SoTAnswer) -> dict:
    trace: dict = {
        "group": answer.group,
        "path": answer.path,
        "reason": answer.reason,
        # SoT was chosen but the skeleton was no plan, so the normal answer was given instead.
        "fallback": answer.skeleton is not None and answer.path == NORMAL,
        "seconds": answer.seconds,
        "usage": {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens},
        "spec_accept_length": answer.accept_length,
        "route": route_trace(answer.route),
    }  # fmt: skip
    if answer.skeleton is not None:
        trace["skeleton"] = _skeleton_trace(answer.skeleton)
    if answer.branches is not None:
        trace["branches"] = _branches_trace(answer.branches)
    if answer.merge is not None:
        merged = answer.merge.merged
        trace["merge"] = {"seconds": answer.merge.seconds, "empty_points": list(merged.empty_points),
                          "repairs": {str(p.index): list(p.repairs) for p in merged.points if p.repairs}}  # fmt: skip
    if answer.normal is not None:
        trace["normal"] = {"seconds": answer.normal.seconds, **_gen_trace(answer.normal.result)}
    if answer.opening is not None:
        trace["opening"] = _opening_trace(answer.opening)
    return trace


def _opening_trace(phase: OpeningPhase) -> dict:
    out = {"kind": phase.opening.kind, "reason": phase.opening.reason, "seconds": phase.seconds}
    return out if phase.result is None else {**out, "text": phase.result.text, **_gen_trace(phase.result)}


def route_trace(route: RoutePhase) -> dict:
    """The route's part of a trace: the router's choice and, where it ran, the latency model's."""
    decision = route.decision
    out = {"use_sot": decision.use_sot, "rule": decision.rule, "source": decision.source, "seconds": route.seconds,
           "gate_wait_seconds": route.gate_wait}  # fmt: skip
    return out if route.latency is None else {**out, "latency": route.latency.info()}


def _skeleton_trace(skeleton: SkeletonPhase) -> dict:
    parse = skeleton.parse
    return {
        "text": skeleton.text,
        "outcome": parse.outcome,
        "reason": parse.reason,
        "points": list(parse.texts),
        "notes": list(parse.notes),
        # Whether a logit processor kept it in the numbered-points format (server-side SoT
        # adds one by default where the server can run it).
        "constrained": skeleton.request.logit_processor is not None and not skeleton.derived,
        "derived": skeleton.derived,
        "seconds": skeleton.seconds,
        "parse_seconds": skeleton.parse_seconds,
        **_gen_trace(skeleton.result),
    }


def _branches_trace(branches: BranchesPhase) -> dict:
    return {
        "seconds": branches.seconds,
        "max_running": branches.plan.max_running,
        "peak_running": branches.peak_running,
        "start_order": list(branches.start_order),
        "dropped_points": list(branches.plan.dropped_points),
        "items": [
            {"index": b.index, "point": b.point, "text": b.result.text, "started": b.started,
             "finished": b.finished, "max_new_tokens": b.request.max_new_tokens,
             **_gen_trace(b.result),
             **({"first_try": {"text": b.first_try.text, **_gen_trace(b.first_try)}} if b.first_try else {})}
            for b in branches.results
        ],
    }  # fmt: skip
