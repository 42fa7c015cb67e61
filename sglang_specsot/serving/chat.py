"""Server-side Skeleton-of-Thought behind SGLang's OpenAI chat route.

Seam: one AROUND hook on `OpenAIServingChat.handle_request`, the host change
"sot-chat-route" (host_changes.py), applied in the HTTP server's process only. It sees the
validated request, the raw request (body and disconnects) and the serving object (tokenizer
manager, SGLang's own chat conversion); a request in mode "off" goes to the original method
as it came. A FastAPI middleware or route would have to re-parse and re-validate every request.

A request opts in with the `specsot` field (serving/field.py); left at the server default
"off", requests that do not opt in go to SGLang's own handler untouched. "auto" routes by the
rules in `sot.router`; "on" forces SoT. A question the router sends to a normal answer is
answered by SGLang's own handler (its response gains `metadata.specsot`). On a server that
can run it (`skeleton_constraint.constraint_runs`), the skeleton is constrained to numbered
points unless the client sent its own processor.

The SoT answer: router -> skeleton -> branches (at most `max_running` at once) -> merge, all
through `TokenizerManager.generate_request` (serving/backend.py), returned as one chat
completion whose `usage` counts every prompt and generated token of the skeleton and the
branches. The skeleton is the `reasoning_content`, the merged answer the `content`, the
per-phase trace `metadata.specsot`; streamed as serving/stream.py says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sglang_specsot.serving.backend import TokenizerManagerBackend
from sglang_specsot.serving.field import FIELD, SoTField, default_mode, parse_field
from sglang_specsot.serving.responses import chat_completion
from sglang_specsot.serving.skeleton_constraint import with_server_constraint
from sglang_specsot.serving.stream import SoTStream
from sglang_specsot.sot.runner import RoutePhase, SoTOptions, SoTPhaseError, new_group, route_phase, run_sot
from sglang_specsot.speculative import adapter as sgl

logger = logging.getLogger(__name__)


def sot_chat_hook() -> Callable:
    """The AROUND hook for the chat route, once the server's default mode is known to be valid."""
    try:
        default_mode()
    except ValueError as exc:
        # SystemExit passes load_plugins' `except Exception`: fail at start-up, not per request.
        raise SystemExit(f"sglang-specsot: {exc}") from None
    return around_handle_request


async def around_handle_request(original, serving, request, raw_request):
    """OpenAIServingChat.handle_request, answering opted-in requests by SoT."""
    try:
        body = await raw_request.body() if raw_request is not None else None
        field = parse_field(body, default_mode())
    except ValueError as exc:
        return serving.create_error_response(str(exc), err_type="BadRequest", status_code=400)
    if field.mode == "off":
        return await original(serving, request, raw_request)
    return await _SoTChat(serving, request, raw_request, field).respond(original)


def sot_question(request) -> tuple[str | None, str]:
    """The question when the chat suits SoT, else (None, why not)."""
    if request.n != 1:
        return None, f"SoT gives one answer, but n={request.n}"
    if request.tools or request.response_format or request.regex or request.ebnf:
        return None, "SoT does not apply to tool calls or constrained output formats"
    if request.logprobs:
        return None, "SoT cannot return per-token logprobs of a merged answer"
    if len(request.messages) != 1 or request.messages[0].role != "user":
        return None, "SoT answers a single user message (no system prompt or history)"
    content = request.messages[0].content
    if not isinstance(content, str):
        parts = [getattr(part, "text", None) for part in content]
        if any(text is None for text in parts):
            return None, "SoT answers text questions only"
        content = "".join(parts)
    return content, ""


class _SoTChat:
    """One opted-in chat request: route it, then answer by SoT or hand it to SGLang."""

    def __init__(self, serving, request, raw_request, field: SoTField) -> None:
        self.serving, self.request, self.raw_request, self.field = serving, request, raw_request, field
        self.group = new_group()

    async def respond(self, original):
        question, why_not = sot_question(self.request)
        if question is None and self.field.mode == "on":
            return self._error(f'"{FIELD}.mode" is "on", but {why_not}')
        if question is None:
            return await original(self.serving, self.request, self.raw_request)
        cap = self.request.max_completion_tokens or self.request.max_tokens
        try:
            options = self.field.options(cap)
        except ValueError as exc:
            return self._error(str(exc))
        route = route_phase(question, options)
        if not route.decision.use_sot:
            return _annotate(await original(self.serving, self.request, self.raw_request), route)
        return await self._sot(question, options, route)

    async def _sot(self, question: str, options: SoTOptions, route: RoutePhase):
        error = sgl.validate_chat_request(self.serving, self.request)
        if error:
            return self._error(error)
        try:
            adapted = sgl.convert_chat_request(self.serving, self.request, self.raw_request)
        except ValueError as exc:
            return self._error(str(exc))
        options = with_server_constraint(options, self.serving.tokenizer_manager.server_args)
        backend = TokenizerManagerBackend(self.serving.tokenizer_manager, adapted, self.raw_request, self.group)
        run = lambda on_delta=None: run_sot(  # noqa: E731
            question, backend, self._render, options, group=self.group, on_delta=on_delta, route=route
        )
        if self.request.stream:
            return await self._streaming(run)
        try:
            answer = await run()
        except SoTPhaseError as exc:
            return self._phase_error(exc)
        return chat_completion(answer, self._id, self.request.model)

    def _render(self, messages: list[dict[str, str]]) -> str:
        tokenizer = self.serving.tokenizer_manager.tokenizer
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _error(self, message: str):
        return self.serving.create_error_response(message, err_type="BadRequest", status_code=400)

    def _phase_error(self, exc: SoTPhaseError):
        if isinstance(exc.cause, ValueError):  # what SGLang raises for bad input (e.g. too long)
            return self._error(str(exc))
        logger.error("server-side SoT failed: %s", exc)
        return self.serving.create_error_response(str(exc), err_type="InternalServerError", status_code=500)

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
        except SoTPhaseError as exc:
            return self._phase_error(exc)
        return StreamingResponse(stream.chunks(first), media_type="text/event-stream")


def _annotate(response, route: RoutePhase):
    """Say on SGLang's own non-streamed response why SoT did not answer."""
    decision = route.decision
    if hasattr(response, "metadata") and hasattr(response, "choices"):
        trace = {"path": "normal", "reason": decision.reason, "route": {"rule": decision.rule}}
        response.metadata = {**(response.metadata or {}), FIELD: trace}
    return response
