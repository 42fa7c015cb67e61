"""Server-side Skeleton-of-Thought behind SGLang's OpenAI chat route.

Seam: one AROUND hook on `OpenAIServingChat.handle_request`, the host change
"sot-chat-route" (host/changes.py), applied in the HTTP server's process only. It sees the
validated request, the raw request (body and disconnects) and the serving object (tokenizer
manager, SGLang's own chat conversion); a request in mode "off" goes to the original method
as it came. A FastAPI middleware or route would have to re-parse and re-validate every request.

A request opts in with the `specsot` field (serving/field.py); left at the server default
"off", requests that do not opt in go to SGLang's own handler untouched. "auto" routes by
`sot.router`, then by the latency model (`sot.latency`, fed by serving/costs.py: the server's
row-cost curve and load), which keeps SoT only where it is predicted faster by a margin, and
answers normally when no SoT slot is free ("busy"); "on" forces SoT. A question sent to a
normal answer is answered by SGLang's own handler (its response gains `metadata.specsot`,
the latency model's numbers under `route.latency`). On a server that
can run it (`skeleton_constraint.constraint_runs`), the skeleton is constrained to numbered
points unless the client sent its own processor.

The SoT answer: router -> skeleton -> branches (at most `max_running` at once) -> merge, all
through `TokenizerManager.generate_request` (serving/backend.py), returned as one chat
completion whose `usage` counts every prompt and generated token of the skeleton and the
branches. The skeleton is the `reasoning_content`, the merged answer the `content`, the
per-phase trace `metadata.specsot`; streamed as serving/stream.py says.

What SGLang's own route would refuse is refused by SGLang's own checks first (empty
messages, a `max_tokens` beyond the context), and a `max_tokens` of 0 or less goes to SGLang's
handler as it came, so those answers match a plain request's. `max_tokens` caps the SoT
answer's total completion tokens (sot/budget.py), within the server's limits (sot/limits.py);
at most `max_groups` SoT answers run at once (serving/gate.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from sglang_specsot.host import adapter as sgl
from sglang_specsot.serving.backend import TokenizerManagerBackend
from sglang_specsot.serving.costs import server_costs
from sglang_specsot.serving.dp_placement import dp_branches
from sglang_specsot.serving.field import FIELD, SoTField, default_mode, parse_field, server_limits
from sglang_specsot.serving.gate import GateFull, GroupGate, Reservation
from sglang_specsot.serving.request_checks import check_custom_logit_processor
from sglang_specsot.serving.responses import aborted_completion, chat_completion, error_status, error_type
from sglang_specsot.serving.router_choice import server_router, warm_up, with_server_classifier
from sglang_specsot.serving.skeleton_constraint import with_server_constraint
from sglang_specsot.serving.stream import SoTStream
from sglang_specsot.sot.latency import LengthBook, ServerLoad, decide, unpriced
from sglang_specsot.sot.limits import SoTLimits, answer_cap
from sglang_specsot.sot.phases import SOT, SoTAnswer, route_trace
from sglang_specsot.sot.prompts import expansion_prompt
from sglang_specsot.sot.quality_gate import configured_quality_gate
from sglang_specsot.sot.router import RouteDecision
from sglang_specsot.sot.runner import (
    RoutePhase, SoTOptions, SoTPhaseError, new_group, plain_request, priced_route, route_phase, run_sot,
    skeleton_request,
)  # fmt: skip

logger = logging.getLogger(__name__)


def sot_chat_hook() -> Callable:
    """The AROUND hook for the chat route, once the server's default mode is known to be valid."""
    try:
        default_mode()
        server_limits()
        dp_branches()
        server_router()
        configured_quality_gate()
    except ValueError as exc:
        # SystemExit passes load_plugins' `except Exception`: fail at start-up, not per request.
        raise SystemExit(f"sglang-specsot: {exc}") from None
    warm_up()
    return around_handle_request


async def around_handle_request(original, serving, request, raw_request):
    """OpenAIServingChat.handle_request, answering opted-in requests by SoT."""
    try:
        body = await raw_request.body() if raw_request is not None else None
        field = parse_field(body, default_mode(), server_limits())
    except ValueError as exc:
        return serving.create_error_response(str(exc), err_type="BadRequest", status_code=400)
    if field.mode == "off":
        return await original(serving, request, raw_request)
    return await _SoTChat(serving, request, raw_request, field).respond(original)


_gate: GroupGate | None = None


def sot_gate() -> GroupGate:
    """The server's one gate on concurrent SoT answers, made on first use."""
    global _gate
    if _gate is None:
        limits = server_limits()
        _gate = GroupGate(limits.max_groups, limits.max_waiting_groups)
    return _gate


_SYSTEM_ROLES = ("system", "developer")  # "developer": OpenAI's newer name for the system turn


def sot_question(request, limits: SoTLimits = SoTLimits()) -> tuple[str | None, str | None, str]:
    """(question, the client's system prompt or None, "") when the chat suits SoT, else
    (None, None, why not)."""
    if request.n != 1:
        return None, None, f"SoT gives one answer, but n={request.n}"
    if request.tools or request.response_format or request.regex or request.ebnf:
        return None, None, "SoT does not apply to tool calls or constrained output formats"
    if request.logprobs:
        return None, None, "SoT cannot return per-token logprobs of a merged answer"
    *system, last = request.messages
    if last.role != "user" or len(system) > 1 or (system and system[0].role not in _SYSTEM_ROLES):
        return None, None, "SoT answers one user message, after at most one system message (no history)"
    texts = [_text(message.content) for message in request.messages]
    if any(text is None for text in texts):
        return None, None, "SoT answers text questions only"
    question, system_prompt = texts[-1], (texts[0].strip() or None if system else None)
    if len(question) > limits.max_question_chars:
        return None, None, (f"the question has {len(question)} characters, above the server limit "
                            f"max_question_chars={limits.max_question_chars}")  # fmt: skip
    return question, system_prompt, ""


def _text(content) -> str | None:
    """A message's text: a string, or the concatenated text parts; None if any part is not text."""
    if isinstance(content, str):
        return content
    parts = [getattr(part, "text", None) for part in content or ()]
    return None if any(text is None for text in parts) else "".join(parts)


class _SoTChat:
    """One opted-in chat request: route it, then answer by SoT or hand it to SGLang."""

    def __init__(self, serving, request, raw_request, field: SoTField) -> None:
        self.serving, self.request, self.raw_request, self.field = serving, request, raw_request, field
        self.group = new_group()
        # SGLang's own reading of the cap (protocol.py:1214), quirks included.
        self.cap: int | None = request.max_completion_tokens or request.max_tokens
        self.original: Callable | None = None  # SGLang's handle_request, set by respond

    async def respond(self, original):
        self.original = original
        error = sgl.validate_chat_request(self.serving, self.request)  # as SGLang's own route does first
        if error:
            return self._error(error)
        if self.cap is not None and self.cap < 1:  # 0: an empty answer; negative: its 400
            return await self._sglang()
        limits = server_limits()
        question, system_prompt, why_not = sot_question(self.request, limits)
        if question is None and self.field.mode == "on":
            return self._error(f'"{FIELD}.mode" is "on", but {why_not}')
        if question is None:
            return await self._sglang()
        try:
            options = self.field.options(answer_cap(self.cap, limits), system_prompt)
        except ValueError as exc:
            return self._error(str(exc))
        # Off the event loop: the classifier encodes the question (and may still be loading).
        options, route = await asyncio.to_thread(_route, question, options)
        if route.decision.use_sot and self.field.mode == "auto":
            route = await self._priced(question, options, route)
        reservation = None
        if route.decision.use_sot and self.field.mode == "auto":
            reservation = await sot_gate().reserve()
            if reservation is None:
                route = _busy(route, sot_gate())
                logger.info("SoT group %s answered normally: every SoT slot is taken", self.group)
        if not route.decision.use_sot:
            return self._observed(_annotate(await self._sglang(), route), route)
        try:
            return await self._sot(question, options, route, reservation)
        finally:
            if reservation is not None:
                reservation.release()  # a request that failed before its answer started

    async def _sglang(self):
        return await self.original(self.serving, self.request, self.raw_request)

    async def _priced(self, question: str, options: SoTOptions, route: RoutePhase) -> RoutePhase:
        """The route with the latency model's verdict (sot/latency.py): SoT only where it is
        predicted faster by the margin on this server, at its load now."""
        costs = server_costs(self.serving.tokenizer_manager)
        curve, why = await costs.curve()
        load, no_load = await costs.load()
        if curve is None or load is None:
            return priced_route(route, unpriced(load or ServerLoad(), why or no_load))
        # The book is read here, on the event loop that writes it; only the tokenizer runs aside.
        points = costs.book.points(options.config)
        prompts = await asyncio.to_thread(self._prompt_tokens, question, options, points)
        decision = decide(curve, load, costs.book.shape(options.config, options.max_new_tokens, *prompts))
        logger.debug("SoT group %s priced: %s", self.group, decision.reason)
        return priced_route(route, decision)

    def _prompt_tokens(self, question: str, options: SoTOptions, points: int) -> tuple[int, int, int]:
        """The normal prompt's, the skeleton prompt's and the branches' shared prompt's tokens
        (the last without its skeleton, which the shape adds as expected), by the model's tokenizer."""
        tokenizer = self.serving.tokenizer_manager.tokenizer
        count = lambda text: len(tokenizer.encode(text))  # noqa: E731
        branch = expansion_prompt(question, ["x"] * points, 0, instructions=options.system_prompt)
        return (count(plain_request(question, self._render, options, self.group).prompt),
                count(skeleton_request(question, self._render, options, self.group).prompt),
                count(branch.render(self._render)))  # fmt: skip

    def _observed(self, response, route: RoutePhase):
        """`response` after noting its length: a normal answer the latency model chose for a
        question the router found suitable is what it expects SoT to beat."""
        usage = getattr(response, "usage", None)
        if route.latency is not None and route.latency.shape is not None and usage is not None:
            server_costs(self.serving.tokenizer_manager).book.observe_normal(usage.completion_tokens)
        return response

    async def _sot(self, question: str, options: SoTOptions, route: RoutePhase, reservation: Reservation | None):
        try:
            adapted = sgl.convert_chat_request(self.serving, self.request, self.raw_request)
        except ValueError as exc:
            return self._error(str(exc))
        if self._beyond_context(adapted):  # SGLang's own handler gives its context-length 400
            return await self._sglang()
        error = _client_processor_error(options, self.serving.tokenizer_manager.server_args)
        if error:
            return self._error(error)
        options = with_server_constraint(options, self.serving.tokenizer_manager.server_args)
        try:
            backend = TokenizerManagerBackend(self.serving.tokenizer_manager, adapted, self.raw_request, self.group)
        except ValueError as exc:  # a routed_dp_rank the server has not
            return self._error(str(exc))

        async def run(on_delta=None):
            asked = time.monotonic()
            async with sot_gate().slot(reservation):
                admitted = dataclasses.replace(route, gate_wait=round(time.monotonic() - asked, 3))
                answer = await run_sot(question, backend, self._render, options, group=self.group,
                                       on_delta=on_delta, route=admitted)  # fmt: skip
            _note_lengths(server_costs(self.serving.tokenizer_manager).book, answer)
            return answer

        if self.request.stream:
            return await self._streaming(run)
        try:
            answer = await run()
        except GateFull as exc:
            return self._busy(exc)
        except SoTPhaseError as exc:
            return self._phase_error(exc)
        return chat_completion(answer, self._id, self.request.model)

    def _beyond_context(self, adapted) -> bool:
        """Whether the chat's prompt and the client's cap exceed the context, the check SGLang
        applies to a plain request (tokenizer_manager.py:1353-1377), which SoT's own smaller
        generations would pass."""
        if self.cap is None:
            return False
        tm = self.serving.tokenizer_manager
        prompt = adapted.input_ids if adapted.input_ids is not None else tm.tokenizer.encode(adapted.text)
        return self.cap + len(prompt) > sgl.request_token_room(tm)

    def _render(self, messages: list[dict[str, str]]) -> str:
        tokenizer = self.serving.tokenizer_manager.tokenizer
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _error(self, message: str):
        return self.serving.create_error_response(message, err_type="BadRequest", status_code=400)

    def _busy(self, exc: GateFull):
        return self.serving.create_error_response(str(exc), err_type="TooManyRequests", status_code=429)

    def _phase_error(self, exc: SoTPhaseError):
        status = error_status(exc)
        if status is None:  # a graceful abort: SGLang answers 200 with finish_reason "abort"
            return aborted_completion(exc, self._id, self.request.model)
        if status >= 500:
            logger.error("server-side SoT failed: %s", exc)
        return self.serving.create_error_response(str(exc), err_type=error_type(status), status_code=status)

    @property
    def _id(self) -> str:
        return f"chatcmpl-specsot-{self.group}"

    async def _streaming(self, run: Callable):
        from fastapi.responses import StreamingResponse

        options = self.request.stream_options
        stream = SoTStream(run, self._id, self.request.model, bool(options and options.include_usage),
                           self.serving.create_streaming_error_response)  # fmt: skip
        try:
            first = await stream.start()  # errors before the first token become an HTTP error
        except GateFull as exc:
            return self._busy(exc)
        except SoTPhaseError as exc:
            return self._phase_error(exc)
        return StreamingResponse(stream.chunks(first), media_type="text/event-stream")


def _busy(route: RoutePhase, gate: GroupGate) -> RoutePhase:
    """The route of an "auto" request when no SoT slot is free. The client asked for the
    faster answer: an SoT answer would wait for a slot behind other answers' branches, so a
    normal answer starts at once. Mode "on" still waits (or gets its 429)."""
    why = (f"all {gate.running} SoT slots (max_groups) are taken; a normal answer starts now "
           "where an SoT answer would wait")  # fmt: skip
    return dataclasses.replace(route, decision=RouteDecision(False, "busy", why))


def _route(question: str, options: SoTOptions) -> tuple[SoTOptions, RoutePhase]:
    """The options with the server's classifier attached (mode "auto"), and the route."""
    options = with_server_classifier(options)
    return options, route_phase(question, options)


def _annotate(response, route: RoutePhase):
    """Say on SGLang's own non-streamed response why SoT did not answer."""
    if hasattr(response, "metadata") and hasattr(response, "choices"):
        trace = {"path": "normal", "reason": route.decision.reason, "route": route_trace(route)}
        response.metadata = {**(response.metadata or {}), FIELD: trace}
    return response


def _note_lengths(book: LengthBook, answer: SoTAnswer) -> None:
    """An SoT answer's skeleton and branch lengths, for the next answers' expected shape."""
    if answer.path == SOT and answer.skeleton is not None and answer.branches is not None:
        branches = [b.result.completion_tokens for b in answer.branches.results]
        book.observe_sot(answer.skeleton.result.completion_tokens, branches)


def _client_processor_error(options: SoTOptions, server_args) -> str | None:
    """Why the client's skeleton processor cannot run, naming our field: the TokenizerManager
    check (request_checks.py) would refuse it too, but naming only SGLang's own field."""
    processor = options.skeleton_logit_processor
    # Without --enable-custom-logit-processor SGLang refuses any processor itself, and this
    # process must not deserialize a client's payload the operator did not allow.
    if processor is None or not getattr(server_args, "enable_custom_logit_processor", False):
        return None
    try:
        check_custom_logit_processor(processor)
    except ValueError as exc:
        return f'"{FIELD}.skeleton_logit_processor": {exc}'
    return None
