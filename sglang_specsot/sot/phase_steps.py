"""The phases of an SoT answer that generate nothing: route (and its pricing), parse or
derive the skeleton, merge the branches, and release merged points in skeleton order.

Each returns its phase's frozen value (`sot.phases`); the runner and the frontend program
call the same functions, so both answers are decided, parsed and merged alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from sglang_specsot.sot.asks import cover_asks, derived_parse
from sglang_specsot.sot.budget import POINT_AIM_TOKENS, fit_plan, min_sot_tokens
from sglang_specsot.sot.config import SoTConfig
from sglang_specsot.sot.latency import LatencyDecision
from sglang_specsot.sot.merge import MergedPoint, clean_expansion, drop_cut_sentence, format_point, merge_answer
from sglang_specsot.sot.options import SoTOptions
from sglang_specsot.sot.phases import BranchesPhase, GenRequest, GenResult, MergePhase, RoutePhase, SkeletonPhase
from sglang_specsot.sot.planner import BranchPlan, plan_branches
from sglang_specsot.sot.prompts import format_skeleton
from sglang_specsot.sot.router import RouteDecision, hard_route, quality_veto, route_question, system_route
from sglang_specsot.sot.router_head import Suitability
from sglang_specsot.sot.skeleton import SkeletonParse, parse_skeleton


def route_phase(question: str, options: SoTOptions) -> RoutePhase:
    """Decide SoT or normal: the router in mode "auto"; forced (bar an empty question) otherwise."""
    started = time.perf_counter()
    classify = options.classifier if options.mode == "auto" else None
    vetoed = system_route(options.system_prompt) if options.system_prompt is not None else None
    if vetoed is None and options.mode == "auto":
        vetoed = quality_veto(question)
    # Encoding a question runs the embedding model: not for one a hard rule, a veto or the cap decides.
    open_question = hard_route(question, options.config, options.max_new_tokens) is None and _fits_sot(options)
    suitability = classify(question) if classify is not None and open_question and vetoed is None else None
    decision = route_question(question, options.config, max_new_tokens=options.max_new_tokens,
                              suitability=suitability)  # fmt: skip
    if vetoed is None and decision.use_sot and suitability is not None:
        vetoed = _question_quality(suitability, options)
    if vetoed is not None and decision.use_sot:
        decision = vetoed
    if options.mode != "auto" and decision.rule != "empty":
        use_sot = options.mode == "on"
        decision = RouteDecision(use_sot, f"mode_{options.mode}", f"mode {options.mode!r} requested")
    if decision.use_sot and not _fits_sot(options):
        floor = min_sot_tokens(options.config)
        why = f"max_new_tokens={options.max_new_tokens} is below {floor}, the least an SoT answer fits in"
        decision = RouteDecision(False, "cap_too_small", why)
    return RoutePhase(decision, time.perf_counter() - started)


def _question_quality(suitability: Suitability, options: SoTOptions) -> RouteDecision | None:
    """A normal answer where a quality head that reads the question's embedding (the vector the
    classifier just computed) finds SoT's answer would read worse; None otherwise."""
    gate = options.quality_gate
    verdict = gate.on_question(suitability.vector) if gate is not None and suitability.vector else None
    if verdict is None or not verdict.worse:
        return None
    return RouteDecision(False, "quality", verdict.reason, "quality_head")


def priced_route(route: RoutePhase, latency: LatencyDecision) -> RoutePhase:
    """The route with the latency model's verdict (sot/latency.py): a normal answer where SoT
    is predicted no faster (its `source` still the router that found the question suitable);
    the router's choice, now with its numbers, otherwise."""
    decision = route.decision
    if decision.use_sot and not latency.use_sot:
        decision = RouteDecision(False, "latency", latency.reason, decision.source)
    return replace(route, decision=decision, latency=latency)


def fitted_plan(parse: SkeletonParse, left: int | None, config: SoTConfig) -> tuple[BranchPlan | None, str]:
    """The branch plan, each point aimed at what a point needs (budget.POINT_AIM_TOKENS),
    within what the cap `left`; or (None, why not). The quality router's trainer reads a
    recorded skeleton through this same function, so it sees the titles the runner planned."""
    if not parse.is_plan:
        return None, f"skeleton {parse.outcome}: {parse.reason}"
    plan = fit_plan(plan_branches(parse, config, POINT_AIM_TOKENS), left, config)
    if plan is None:
        return None, f"the {left} tokens the cap left after the skeleton cannot hold {config.min_points} branches"
    return plan, ""


def quality_checked(question: str, plan: BranchPlan, options: SoTOptions) -> tuple[BranchPlan | None, str]:
    """`plan`, or (None, why) where mode "auto" has a quality gate that reads the planned
    skeleton and finds SoT's answer would read worse than the normal one. Checked before any
    branch is spent, so a veto costs only the skeleton."""
    gate = options.quality_gate
    if options.mode != "auto" or gate is None:
        return plan, ""
    verdict = gate.on_plan(question, plan.points)
    if verdict is None or not verdict.worse:
        return plan, ""
    return None, verdict.reason


def _fits_sot(options: SoTOptions) -> bool:
    cap = options.max_new_tokens
    return cap is None or cap >= min_sot_tokens(options.config)


def parse_phase(
    question: str, request: GenRequest, result: GenResult, seconds: float, config: SoTConfig
) -> SkeletonPhase:
    """Parse the skeleton, then add a point for each item the question names that it misses."""
    started = time.perf_counter()
    parse = parsed_skeleton(question, result.text, config, prefill=request.prefill,
                            truncated=result.finish_reason == "length")  # fmt: skip
    return SkeletonPhase(request, result, parse, seconds, time.perf_counter() - started)


def parsed_skeleton(question: str, text: str, config: SoTConfig, *, prefill: str, truncated: bool) -> SkeletonParse:
    """The skeleton `text` parsed, with a point added for each item the question names that it
    misses: `parse_phase`'s parse, which the quality router's trainer reads recorded skeletons by."""
    return cover_asks(parse_skeleton(text, config, prefill=prefill, truncated=truncated), question, config)


def derived_phase(question: str, request: GenRequest, config: SoTConfig) -> SkeletonPhase | None:
    """The skeleton phase of a question that names its items (`derived_parse`): no generation."""
    started = time.perf_counter()
    parse = derived_parse(question, config)
    if parse is None:
        return None
    text = format_skeleton(parse.texts).removeprefix(request.prefill)
    result = GenResult(text, prompt_tokens=0, completion_tokens=0, finish_reason="stop")
    return SkeletonPhase(request, result, parse, 0.0, time.perf_counter() - started, derived=True)


def merged_point(points: Sequence[str], index: int, text: str, question: str = "") -> MergedPoint:
    """Merge one branch on its own: exactly the point `merge_answer` would produce."""
    expansion, repairs = clean_expansion(text, index, points, question)
    return MergedPoint(index, points[index], expansion, repairs)


def usable_text(result: GenResult) -> str:
    """A branch's text for the answer: one cut by its budget loses its unfinished sentence."""
    return drop_cut_sentence(result.text) if result.finish_reason == "length" else result.text


def merge_phase(branches: BranchesPhase, question: str = "") -> MergePhase:
    started = time.perf_counter()
    merged = merge_answer(branches.plan.points, {b.index: usable_text(b.result) for b in branches.results}, question)
    return MergePhase(merged, time.perf_counter() - started)


class PointReleaser:
    """Releases finished points as answer text in skeleton order; a point waits for earlier ones.

    The pieces it emits concatenate to exactly `merge_answer(...).text`.
    """

    def __init__(self, points: Sequence[str], emit: Callable[[str], None], question: str = "") -> None:
        self._points = tuple(points)
        self._emit = emit
        self._question = question
        self._ready: dict[int, str] = {}
        self._next = 0
        self.released = ""

    def finish(self, index: int, text: str) -> None:
        self._ready[index] = format_point(merged_point(self._points, index, text, self._question))
        while self._next in self._ready:
            piece = ("\n" if self._next else "") + self._ready.pop(self._next)
            self.released += piece
            self._next += 1
            self._emit(piece)
