"""The phases of one Skeleton-of-Thought answer, run against any generation backend.

route -> skeleton -> parse -> plan -> branches -> merge, one frozen dataclass per phase
(`sot.phases`). The async `run_sot` is the one control flow of an SoT answer; it drives a
`SoTBackend` (`sot.branches`): the server's TokenizerManager (server-side SoT), the frontend
program's interpreter state (`frontend.py`, a `ForkingBackend`), or a fake in tests. The
requests it sends are built in `sot.gen_requests`, the phases that generate nothing run in
`sot.phase_steps`; callers import all of it from here. No SGLang import: the pure core plus
asyncio.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

from sglang_specsot.sot.branches import SoTBackend, cancel, generate, run_branches
from sglang_specsot.sot.budget import remaining
from sglang_specsot.sot.gen_requests import Render, branch_requests, new_group, plain_request, retry_request, skeleton_request
from sglang_specsot.sot.gen_requests import shared_prefix  # noqa: F401 (re-exported)
from sglang_specsot.sot.opening import OpeningWatch
from sglang_specsot.sot.options import SoTOptions
from sglang_specsot.sot.phase_steps import PointReleaser, derived_phase, fitted_plan, merge_phase, parse_phase
from sglang_specsot.sot.phase_steps import quality_checked, route_phase
from sglang_specsot.sot.phase_steps import priced_route  # noqa: F401 (re-exported)
from sglang_specsot.sot.phases import (
    NORMAL,
    SOT,
    BranchesPhase,
    MergePhase,
    NormalPhase,
    OpeningPhase,
    RoutePhase,
    SkeletonPhase,
    SoTAnswer,
)
from sglang_specsot.sot.phases import GenRequest, GenResult, SoTPhaseError  # noqa: F401 (re-exported)
from sglang_specsot.sot.tag import BRANCH, PLAIN, SKELETON  # noqa: F401 (re-exported)

# Channels of streamed text: the skeleton (the plan) and the answer itself.
SKELETON_CHANNEL, ANSWER_CHANNEL = "skeleton", "answer"

DeltaSink = Callable[[str, str], None]  # (channel, new text)


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
    plan, reason = fitted_plan(skeleton.parse, left, options.config)
    if plan is not None:
        plan, reason = quality_checked(question, plan, options)
    if plan is None:
        normal = await _normal(question, backend, render, options, group, to_answer, left)
        return assemble_answer(group, NORMAL, reason, route, started, skeleton=skeleton, normal=normal, opening=opening)
    if opening is not None and opening.lead:
        to_answer(opening.lead)  # only now: a skeleton that is no plan gets a whole normal answer
    requests = branch_requests(question, plan, render, options, group)
    releaser = PointReleaser(plan.points, to_answer, question)
    retry = lambda request, result: retry_request(question, plan, render, options, request, result)  # noqa: E731
    branches = await run_branches(backend, plan, requests, releaser.finish, retry)
    merge = merge_phase(branches, question)
    assert merge.merged.text == releaser.released, "streamed points differ from the merged answer"
    return assemble_answer(group, SOT, route.decision.reason, route, started, skeleton, branches, merge,
                           opening=opening)  # fmt: skip


def reads_opening(backend: SoTBackend, options: SoTOptions) -> bool:
    """Whether this answer reads the normal answer's first line before SoT commits: where its
    config asks in its mode and the backend can end a generation on its text."""
    return options.config.reads_opening(options.mode) and getattr(backend, "watches_text", False)


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
    normal = asyncio.create_task(generate(backend, request, "normal answer", on_normal))
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
            await cancel((skeleton,))
            result = await normal
            seconds = time.perf_counter() - started
            return OpeningPhase(watch.verdict, None, seconds), NormalPhase(request, result, seconds), None
        # The intro alone, whether the backend stopped there or the answer ended at it.
        result = replace(await normal, text=watch.text[: watch.verdict.keep])
        opening = OpeningPhase(watch.verdict, result, time.perf_counter() - started)
        release(SKELETON_CHANNEL)
        return opening, None, await skeleton
    finally:
        await cancel((normal, skeleton, verdict))


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
    result = await generate(backend, request, "skeleton", lambda t: emit(SKELETON_CHANNEL, t))
    return parse_phase(question, request, result, time.perf_counter() - started, options.config)


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
    result = await generate(backend, request, "normal answer", on_text)
    return NormalPhase(request, result, time.perf_counter() - started)


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
