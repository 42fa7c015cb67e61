"""The phases of one Skeleton-of-Thought answer, run against any generation backend.

route -> skeleton -> parse -> plan -> branches -> merge, one frozen dataclass per phase
(`sot.phases`). The async `run_sot` is the one control flow of an SoT answer; it drives a
`SoTBackend`: the server's TokenizerManager (server-side SoT), the frontend program's
interpreter state (`frontend.py`, a `ForkingBackend`), or a fake in tests. No SGLang import:
the pure core plus asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from sglang_specsot.sot.asks import cover_asks, derived_parse
from sglang_specsot.sot.budget import (
    aim_tokens,
    fit_plan,
    min_sot_tokens,
    point_target,
    remaining,
    skeleton_budget,
)
from sglang_specsot.sot.config import DEFAULT_CONFIG, SoTConfig
from sglang_specsot.sot.latency import LatencyDecision
from sglang_specsot.sot.merge import MergedPoint, clean_expansion, drop_cut_sentence, format_point, merge_answer
from sglang_specsot.sot.opening import OpeningWatch
from sglang_specsot.sot.planner import Branch, BranchPlan, plan_branches, point_aim
from sglang_specsot.sot.prompts import expansion_prompt, format_skeleton, normal_messages, skeleton_prompt
from sglang_specsot.sot.router import QuestionClassifier, RouteDecision, hard_route, route_question, system_route
from sglang_specsot.sot.skeleton import parse_skeleton
from sglang_specsot.sot.phases import (  # noqa: F401 (re-exported: callers import them from here)
    NORMAL,
    SOT,
    BranchesPhase,
    BranchResult,
    GenRequest,
    GenResult,
    MergePhase,
    NormalPhase,
    OpeningPhase,
    RoutePhase,
    SkeletonPhase,
    SoTAnswer,
    SoTPhaseError,
    ended_by,
)
from sglang_specsot.sot.tag import BRANCH, MODES, PLAIN, SKELETON, SoTTag

logger = logging.getLogger(__name__)

# Channels of streamed text: the skeleton (the plan) and the answer itself.
SKELETON_CHANNEL, ANSWER_CHANNEL = "skeleton", "answer"

Render = Callable[[list[dict[str, str]]], str]  # messages -> prompt text, generation prompt added
DeltaSink = Callable[[str, str], None]  # (channel, new text)
Retry = Callable[[GenRequest, GenResult], "GenRequest | None"]  # a branch's second request, if it needs one


@dataclass(frozen=True, slots=True)
class SoTOptions:
    """What a caller asks of one SoT answer; validated at construction."""

    mode: str = "auto"  # "auto": the router decides; "on": always try SoT; "off": never
    config: SoTConfig = DEFAULT_CONFIG
    # The caller's cap on the answer's total completion tokens (skeleton + branches, or the
    # normal answer): what an OpenAI client's max_tokens means (sot.budget splits it).
    max_new_tokens: int | None = None
    # A serialized sglang CustomLogitProcessor for the skeleton (the server needs
    # --enable-custom-logit-processor); None: unconstrained.
    skeleton_logit_processor: str | None = None
    # The question classifier that routes in mode "auto" once the hard rules have passed
    # (models/router_classifier.py); None: the rules alone. Server-side SoT and the frontend
    # program plug in the shipped one by default.
    classifier: QuestionClassifier | None = None
    # The client's system prompt (persona, language, tone), or None: the skeleton is planned
    # for it, every branch is written under it, a normal answer gets it as its system turn,
    # and in mode "auto" the hard rules read it too (a system prompt that asks for code,
    # JSON or brevity keeps the answer normal, whatever the question).
    system_prompt: str | None = None
    # The completion tokens a SoT answer aims at: the geometric mean of the server's recent
    # normal answers to suitable questions (sot.budget); None: the prior.
    aim_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is not one of {MODES}")
        if not isinstance(self.config, SoTConfig):
            raise ValueError(f"config must be a SoTConfig, got {type(self.config).__name__}")
        cap = self.max_new_tokens
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise ValueError(f"max_new_tokens={cap!r} must be a positive integer or None")
        processor = self.skeleton_logit_processor
        if processor is not None and not (isinstance(processor, str) and processor):
            raise ValueError(
                "skeleton_logit_processor must be a serialized CustomLogitProcessor string "
                f"(CustomLogitProcessor.to_str()) or None, got {processor!r}"
            )
        if self.classifier is not None and not callable(self.classifier):
            raise ValueError(
                f"classifier must be a callable question -> Suitability or None, got {self.classifier!r}"
            )
        aim = self.aim_tokens
        if aim is not None and (not isinstance(aim, int) or isinstance(aim, bool) or aim < 1):
            raise ValueError(f"aim_tokens={aim!r} must be a positive integer (tokens) or None for the prior")
        system = self.system_prompt
        if system is not None and not (isinstance(system, str) and system.strip()):
            raise ValueError(f"system_prompt must be non-empty text or None, got {system!r}")




class SoTBackend(Protocol):
    """Anything that can run a GenRequest; `on_text` gets each new piece of text as it decodes.

    For role "plain" a backend may send its own rendering of the same one-turn chat (the
    server uses SGLang's chat conversion, so a plain answer is what /v1/chat/completions gives).
    """

    async def generate(
        self, request: GenRequest, on_text: Callable[[str], None] | None = None
    ) -> GenResult: ...


@runtime_checkable
class ForkingBackend(SoTBackend, Protocol):
    """A backend that prefills the branches' shared prompt prefix once (the frontend's `fork`).

    `run_branches` enters `fork_branches(requests)` before the first branch starts and leaves
    it after the last one ended. SGLang's radix cache shares only what is already cached
    when a request is scheduled: branches admitted in one prefill batch would each prefill
    the whole prefix (question and skeleton) again, so both backends commit it first.
    """

    def fork_branches(
        self, requests: dict[int, GenRequest]
    ) -> contextlib.AbstractAsyncContextManager[None]: ...


# -- request builders (shared with the frontend program) -----------------------------------


def new_group() -> str:
    return uuid.uuid4().hex


def route_phase(question: str, options: SoTOptions) -> RoutePhase:
    """Decide SoT or normal: the router in mode "auto"; forced (bar an empty question) otherwise."""
    started = time.perf_counter()
    classify = options.classifier if options.mode == "auto" else None
    vetoed = system_route(options.system_prompt) if options.system_prompt is not None else None
    # Encoding a question runs the embedding model: not for one a hard rule or the cap decides.
    open_question = hard_route(question, options.config, options.max_new_tokens) is None and _fits_sot(options)
    suitability = classify(question) if classify is not None and open_question and vetoed is None else None
    decision = route_question(question, options.config, max_new_tokens=options.max_new_tokens,
                              suitability=suitability)  # fmt: skip
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


def priced_route(route: RoutePhase, latency: LatencyDecision) -> RoutePhase:
    """The route with the latency model's verdict (sot/latency.py): a normal answer where SoT
    is predicted no faster (its `source` still the router that found the question suitable);
    the router's choice, now with its numbers, otherwise."""
    decision = route.decision
    if decision.use_sot and not latency.use_sot:
        decision = RouteDecision(False, "latency", latency.reason, decision.source)
    return replace(route, decision=decision, latency=latency)


def _fits_sot(options: SoTOptions) -> bool:
    cap = options.max_new_tokens
    return cap is None or cap >= min_sot_tokens(options.config)


def plain_request(
    question: str, render: Render, options: SoTOptions, group: str, budget: int | None = None
) -> GenRequest:
    """The normal answer; `budget` is what the cap left after a skeleton (default: the cap)."""
    prompt = render(normal_messages(question, options.system_prompt))
    cap = options.max_new_tokens if budget is None else budget
    return GenRequest(prompt, cap, SoTTag(group, PLAIN))


def skeleton_request(question: str, render: Render, options: SoTOptions, group: str) -> GenRequest:
    chat = skeleton_prompt(question, instructions=options.system_prompt)
    return GenRequest(
        chat.render(render),
        skeleton_budget(options.config, options.max_new_tokens),
        SoTTag(group, SKELETON),
        chat.assistant_prefix,
        options.skeleton_logit_processor,
    )


def branch_requests(
    question: str, plan: BranchPlan, render: Render, options: SoTOptions, group: str
) -> dict[int, GenRequest]:
    """One request per planned branch, keyed by skeleton index (budgets already fit the cap)."""
    points, n = plan.points, len(plan.branches)
    requests = {}
    for branch in plan.branches:
        chat = expansion_prompt(
            question, points, branch.index, prefill_header=options.config.prefill_point_header,
            instructions=options.system_prompt, point_tokens=plan.point_tokens,
        )  # fmt: skip
        requests[branch.index] = GenRequest(
            chat.render(render),
            branch.max_new_tokens,
            SoTTag(group, BRANCH, branch.index, n),
            chat.assistant_prefix,
            stop_on_loop=True,
            end_after=_end_after(branch, plan),
        )
    return requests


def _end_after(branch: Branch, plan: BranchPlan) -> int | None:
    """Where a branch may end at its next sentence: its aimed length, within its budget."""
    aim = point_aim(branch.predicted_tokens, plan.point_tokens)
    return None if aim is None else min(aim, branch.max_new_tokens)


# A retried branch needs room to write a sentence or two; with less left it keeps its title.
RETRY_MIN_TOKENS = 16


def retry_request(
    question: str, plan: BranchPlan, render: Render, options: SoTOptions, first: GenRequest, result: GenResult
) -> GenRequest | None:
    """A second request for a branch that stopped after writing only its point's title, or
    None when the first answer stands.

    Small models (Qwen2.5-Coder-0.5B, the demo's) end some points right after restating the
    title ("Use time management apps."), which leaves the point empty. Asked again with the
    title and a colon pre-filled, they write the point's content, where a pre-filled header
    "3. Use ..." gets nothing. The retry gets what is left of the branch's budget, so the
    answer stays within its cap."""
    index, points = first.tag.point, plan.points
    if not options.config.retry_empty_points or result.finish_reason != "stop" or ended_by(result) != "stop":
        return None
    if merged_point(points, index, result.text).expansion:
        return None
    left = first.max_new_tokens - result.completion_tokens
    if left < RETRY_MIN_TOKENS:
        return None
    chat = expansion_prompt(question, points, index, instructions=options.system_prompt, lead_in=True,
                            point_tokens=plan.point_tokens)  # fmt: skip
    end_after = None if first.end_after is None else max(1, min(left, first.end_after - result.completion_tokens))
    return GenRequest(chat.render(render), left, first.tag, chat.assistant_prefix, stop_on_loop=first.stop_on_loop,
                      end_after=end_after)  # fmt: skip


def shared_prefix(prompts: Iterable[str]) -> str:
    """The text every prompt starts with, up to its last line break: what a fork commits once
    for all branches.

    Cut at a line break because the radix cache matches tokens, not characters: a prefix
    ending mid-line ("...Write only point ") can tokenize differently alone than inside the
    full prompt, and then the branches would match less of it than was committed.
    """
    common = os.path.commonprefix(list(prompts))  # character-wise, despite its module
    return common[: common.rfind("\n") + 1]


def parse_phase(
    question: str, request: GenRequest, result: GenResult, seconds: float, config: SoTConfig
) -> SkeletonPhase:
    """Parse the skeleton, then add a point for each item the question names that it misses."""
    started = time.perf_counter()
    parse = parse_skeleton(result.text, config, prefill=request.prefill, truncated=result.finish_reason == "length")
    parse = cover_asks(parse, question, config)
    return SkeletonPhase(request, result, parse, seconds, time.perf_counter() - started)


def merged_point(points: Sequence[str], index: int, text: str) -> MergedPoint:
    """Merge one branch on its own: exactly the point `merge_answer` would produce."""
    expansion, repairs = clean_expansion(text, index, points)
    return MergedPoint(index, points[index], expansion, repairs)


def usable_text(result: GenResult) -> str:
    """A branch's text for the answer: one cut by its budget loses its unfinished sentence."""
    return drop_cut_sentence(result.text) if result.finish_reason == "length" else result.text


def merge_phase(branches: BranchesPhase) -> MergePhase:
    started = time.perf_counter()
    merged = merge_answer(branches.plan.points, {b.index: usable_text(b.result) for b in branches.results})
    return MergePhase(merged, time.perf_counter() - started)


class PointReleaser:
    """Releases finished points as answer text in skeleton order; a point waits for earlier ones.

    The pieces it emits concatenate to exactly `merge_answer(...).text`.
    """

    def __init__(self, points: Sequence[str], emit: Callable[[str], None]) -> None:
        self._points = tuple(points)
        self._emit = emit
        self._ready: dict[int, str] = {}
        self._next = 0
        self.released = ""

    def finish(self, index: int, text: str) -> None:
        self._ready[index] = format_point(merged_point(self._points, index, text))
        while self._next in self._ready:
            piece = ("\n" if self._next else "") + self._ready.pop(self._next)
            self.released += piece
            self._next += 1
            self._emit(piece)


# -- the async runner --------------------------------------------------------------------------


async def run_sot(
    question: str,
    backend: SoTBackend,
    render: Render,
    options: SoTOptions = SoTOptions(),
    *,
    group: str | None = None,
    on_delta: DeltaSink | None = None,
    route: RoutePhase | None = None,
) -> SoTAnswer:
    """Answer `question` by SoT where it fits, else normally; stream through `on_delta`.

    Streamed order: the skeleton (pre-fill first) on channel "skeleton" as it decodes; then
    on channel "answer" each point's merged text in skeleton order, or the normal answer.
    """
    started = time.perf_counter()
    group = group or new_group()
    route = route or route_phase(question, options)
    emit = on_delta or (lambda channel, text: None)
    to_answer = lambda text: emit(ANSWER_CHANNEL, text)  # noqa: E731
    if not route.decision.use_sot:
        normal = await _normal(question, backend, render, options, group, to_answer)
        return assemble_answer(group, NORMAL, route.decision.reason, route, started, normal=normal)
    opening = None
    if reads_opening(backend, options):
        opening, normal, skeleton = await _opening_and_skeleton(question, backend, render, options, group, emit)
        if normal is not None:  # prose: the normal answer it began is the answer
            reason = f"opening: {opening.opening.reason}"
            return assemble_answer(group, NORMAL, reason, route, started, normal=normal, opening=opening)
    else:
        skeleton = await _skeleton(question, backend, render, options, group, emit)
    spent = skeleton.result.completion_tokens + (opening.result.completion_tokens if opening else 0)
    left = remaining(options.max_new_tokens, spent)
    plan, reason = _fitted_plan(skeleton, left, options, spent)
    if plan is None:
        normal = await _normal(question, backend, render, options, group, to_answer, left)
        return assemble_answer(group, NORMAL, reason, route, started, skeleton=skeleton, normal=normal, opening=opening)
    if opening is not None and opening.lead:
        to_answer(opening.lead)  # only now: a skeleton that is no plan gets a whole normal answer
    requests = branch_requests(question, plan, render, options, group)
    releaser = PointReleaser(plan.points, to_answer)
    retry = lambda request, result: retry_request(question, plan, render, options, request, result)  # noqa: E731
    branches = await run_branches(backend, plan, requests, releaser.finish, retry)
    merge = merge_phase(branches)
    assert merge.merged.text == releaser.released, "streamed points differ from the merged answer"
    return assemble_answer(group, SOT, route.decision.reason, route, started, skeleton, branches, merge,
                           opening=opening)  # fmt: skip


def reads_opening(backend: SoTBackend, options: SoTOptions) -> bool:
    """Whether this answer reads the normal answer's first line before SoT commits: where its
    config asks in its mode and the backend can end a generation on its text."""
    return options.config.reads_opening(options.mode) and getattr(backend, "watches_text", False)


def _fitted_plan(
    skeleton: SkeletonPhase, left: int | None, options: SoTOptions, spent: int
) -> tuple[BranchPlan | None, str]:  # fmt: skip
    """The branch plan, each point aimed at its share of the expected answer length less the
    `spent` tokens (skeleton, intro), within what the cap `left`; or (None, why not)."""
    parse, config = skeleton.parse, options.config
    if not parse.is_plan:
        return None, f"skeleton {parse.outcome}: {parse.reason}"
    aim = aim_tokens(options.aim_tokens, options.max_new_tokens)
    points = min(len(parse.points), config.branch_cap)
    target = point_target(aim, spent, points)
    plan = fit_plan(plan_branches(parse, config, target), left, config)
    if plan is None:
        return None, f"the {left} tokens the cap left after the skeleton cannot hold {config.min_points} branches"
    return plan, ""


async def _opening_and_skeleton(
    question: str, backend: SoTBackend, render: Render, options: SoTOptions, group: str, emit: DeltaSink
) -> tuple[OpeningPhase, NormalPhase | None, SkeletonPhase | None]:  # fmt: skip
    """The normal answer and the skeleton at once, until the normal answer's first line
    decides (sot.opening): prose cancels the skeleton and goes on as the normal answer
    (returned); an announced list was stopped by the backend at its intro, and the skeleton
    is awaited (returned). Nothing streams before the verdict: then the normal answer's
    text so far (prose), or the skeleton's (a list). The answer's cap bounds the normal one;
    the tokens a cancelled skeleton decoded are in no usage count."""
    watch = OpeningWatch(options.config.opening_chars)
    decided = asyncio.Event()
    held: dict[str, list[str]] = {ANSWER_CHANNEL: [], SKELETON_CHANNEL: []}

    def release(channel: str) -> None:
        text, held[channel] = "".join(held[channel]), []
        if text:
            emit(channel, text)

    def on_normal(piece: str) -> None:
        if decided.is_set():
            if not watch.verdict.has_points:
                emit(ANSWER_CHANNEL, piece)
            return
        held[ANSWER_CHANNEL].append(piece)
        if watch.feed(piece) is not None:
            decided.set()
            if not watch.verdict.has_points:
                release(ANSWER_CHANNEL)

    def on_skeleton(channel: str, text: str) -> None:
        if not decided.is_set():
            held[channel].append(text)
        elif watch.verdict.has_points:
            emit(channel, text)

    request = replace(plain_request(question, render, options, group), read_opening=options.config.opening_chars)
    started = time.perf_counter()
    normal = asyncio.create_task(_generate(backend, request, "normal answer", on_normal))
    skeleton = asyncio.create_task(_skeleton(question, backend, render, options, group, on_skeleton))
    verdict = asyncio.create_task(decided.wait())
    try:
        await asyncio.wait((normal, verdict), return_when=asyncio.FIRST_COMPLETED)
        if normal.done() and normal.exception() is not None:
            return normal.result()  # raises the normal answer's SoTPhaseError
        if watch.verdict is None:  # it ended within its first line
            watch.end()
            decided.set()
            release(ANSWER_CHANNEL)
        if not watch.verdict.has_points:
            await _cancel((skeleton,))
            result = await normal
            seconds = time.perf_counter() - started
            return OpeningPhase(watch.verdict, None, seconds), NormalPhase(request, result, seconds), None
        # The intro alone, whether the backend stopped there or the answer ended at it.
        result = replace(await normal, text=watch.text[: watch.verdict.keep])
        opening = OpeningPhase(watch.verdict, result, time.perf_counter() - started)
        release(SKELETON_CHANNEL)
        return opening, None, await skeleton
    finally:
        await _cancel((normal, skeleton, verdict))


async def _skeleton(
    question: str,
    backend: SoTBackend,
    render: Render,
    options: SoTOptions,
    group: str,
    emit: DeltaSink,
) -> SkeletonPhase:
    request = skeleton_request(question, render, options, group)
    derived = derived_phase(question, request, options.config)
    if derived is not None:
        emit(SKELETON_CHANNEL, derived.text)  # the plan still streams, as a written one would
        return derived
    emit(SKELETON_CHANNEL, request.prefill)
    started = time.perf_counter()
    result = await _generate(backend, request, "skeleton", lambda t: emit(SKELETON_CHANNEL, t))
    return parse_phase(question, request, result, time.perf_counter() - started, options.config)


def derived_phase(question: str, request: GenRequest, config: SoTConfig) -> SkeletonPhase | None:
    """The skeleton phase of a question that names its items (`derived_parse`): no generation."""
    started = time.perf_counter()
    parse = derived_parse(question, config)
    if parse is None:
        return None
    text = format_skeleton(parse.texts).removeprefix(request.prefill)
    result = GenResult(text, prompt_tokens=0, completion_tokens=0, finish_reason="stop")
    return SkeletonPhase(request, result, parse, 0.0, time.perf_counter() - started, derived=True)


async def _normal(
    question: str,
    backend: SoTBackend,
    render: Render,
    options: SoTOptions,
    group: str,
    on_text: Callable[[str], None],
    budget: int | None = None,
) -> NormalPhase:
    # A skeleton step past its max_new_tokens (a speculative overshoot) could leave 0, which
    # the backend would send as "no limit": the answer gets at least one token.
    request = plain_request(question, render, options, group, None if budget is None else max(1, budget))
    started = time.perf_counter()
    result = await _generate(backend, request, "normal answer", on_text)
    return NormalPhase(request, result, time.perf_counter() - started)


async def _generate(
    backend: SoTBackend, request: GenRequest, phase: str, on_text: Callable[[str], None] | None
) -> GenResult:
    try:
        return await backend.generate(request, on_text)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        raise SoTPhaseError(phase, exc) from exc


async def run_branches(
    backend: SoTBackend,
    plan: BranchPlan,
    requests: dict[int, GenRequest],
    on_finish: Callable[[int, str], None] | None = None,
    retry: Retry | None = None,
) -> BranchesPhase:
    """Run the plan's branches, at most `plan.max_running` at once, starting waiting ones as
    others finish; a branch for which `retry` returns a second request runs once more, in
    the slot it had. On any failure or cancellation every running branch is cancelled."""
    started = time.perf_counter()  # the phase includes committing the shared prefix
    scope = backend.fork_branches(requests) if isinstance(backend, ForkingBackend) else _no_fork()
    async with scope:
        return await _run_branches(backend, plan, requests, on_finish, started, retry)


@contextlib.asynccontextmanager
async def _no_fork():
    yield


async def _run_branches(
    backend: SoTBackend,
    plan: BranchPlan,
    requests: dict[int, GenRequest],
    on_finish: Callable[[int, str], None] | None,
    started: float,
    retry: Retry | None = None,
) -> BranchesPhase:
    scheduler = plan.scheduler()
    requests = dict(requests)  # a retried branch's entry becomes its second request
    first_tries: dict[int, GenResult] = {}
    running: dict[int, asyncio.Task] = {}
    started_at: dict[int, float] = {}
    done: dict[int, BranchResult] = {}
    order: list[int] = []
    peak = 0
    try:
        while not scheduler.is_done(done):
            for branch in scheduler.next_to_start(running, done):
                started_at[branch.index] = time.perf_counter() - started
                running[branch.index] = asyncio.create_task(backend.generate(requests[branch.index]))
                order.append(branch.index)
            peak = max(peak, len(running))
            finished, _ = await asyncio.wait(running.values(), return_when=asyncio.FIRST_COMPLETED)
            for index in sorted(i for i, task in running.items() if task in finished):
                result = _branch_result(running.pop(index), index)
                again = retry(requests[index], result) if retry is not None and index not in first_tries else None
                if again is not None:  # still running, in the slot it had: no other branch waits longer
                    logger.info("SoT branch %d wrote only its title; asking once more", index + 1)
                    first_tries[index], requests[index] = result, again
                    running[index] = asyncio.create_task(backend.generate(again))
                    continue
                branch = BranchResult(
                    index, plan.points[index], requests[index], result,
                    started_at[index], time.perf_counter() - started, first_tries.get(index),
                )  # fmt: skip
                done[index] = branch
                if on_finish is not None:
                    on_finish(index, usable_text(result))
    finally:
        await _cancel(running.values())
    results = tuple(done[i] for i in sorted(done))
    return BranchesPhase(plan, results, tuple(order), peak, time.perf_counter() - started)


def _branch_result(task: asyncio.Task, index: int) -> GenResult:
    exc = task.exception()
    if exc is not None:
        raise SoTPhaseError(f"branch {index + 1}", exc) from exc
    return task.result()


async def _cancel(tasks: Iterable[asyncio.Task]) -> None:
    """Cancel and await the tasks, so none outlives its answer (the backend aborts them)."""
    tasks = list(tasks)
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    # Gathering the finished ones too marks their exceptions as retrieved.
    await asyncio.gather(*tasks, return_exceptions=True)
    if pending:
        logger.info("cancelled %d running SoT generations", len(pending))


def assemble_answer(
    group: str,
    path: str,
    reason: str,
    route: RoutePhase,
    started: float,
    skeleton: SkeletonPhase | None = None,
    branches: BranchesPhase | None = None,
    merge: MergePhase | None = None,
    normal: NormalPhase | None = None,
    opening: OpeningPhase | None = None,
) -> SoTAnswer:
    lead = opening.lead if opening is not None else ""
    text = lead + merge.merged.text if merge is not None else normal.result.text
    seconds = time.perf_counter() - started
    return SoTAnswer(group, path, reason, text, route, skeleton, branches, merge, normal, seconds, opening)
