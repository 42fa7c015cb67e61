"""Server-side Skeleton-of-Thought behind SGLang's OpenAI chat route.

A /v1/chat/completions request opts in with a top-level field (SGLang's ChatCompletionRequest
ignores unknown fields, so the hook reads it from the raw JSON body):

    "specsot": {"mode": "auto" | "on" | "off",        # default "auto"
                "config": {<SoTConfig field>: value},  # optional overrides, e.g. max_running
                "skeleton_logit_processor": "<CustomLogitProcessor.to_str()>"}  # optional

(with the OpenAI client: `extra_body={"specsot": {"mode": "auto"}}`; with bench_serving:
`--extra-request-body '{"specsot": {"mode": "on"}}'`). The environment variable
SGLANG_SPECSOT_SOT_MODE (default "off") is the mode of requests without the field; left at
"off", requests that do not opt in go to SGLang's own handler untouched. "auto" routes by the
rules in `sot.router`; "on" forces SoT. A question the router sends to a normal answer is
answered by SGLang's own handler (its response gains `metadata.specsot`).

The SoT answer: router -> skeleton -> branches (at most `max_running` at once) -> merge, all
through `TokenizerManager.generate_request`, returned as one chat completion whose `usage`
counts every prompt and generated token of the skeleton and the branches. The skeleton is the
`reasoning_content`, the merged answer the `content`, the per-phase trace `metadata.specsot`.

Streaming order: the skeleton first, token by token, as `reasoning_content` deltas (starting
with its pre-filled "1."); then the answer as `content` deltas, one whole point at a time in
skeleton order: a point is sent once its branch and all earlier points are done (a finished
later point waits). So the concatenated deltas equal the non-streamed message exactly. When
the skeleton is unusable the normal answer follows as `content` deltas, token by token.

Every use of SGLang internals (`_validate_request`, `_convert_to_internal_request`,
`incremental_streaming_output`, the protocol models) is in this module.

Seam: one AROUND hook (SGLang's public HookRegistry) on `OpenAIServingChat.handle_request`,
installed in the HTTP server's process only. It sees the validated request, the raw request
(body and disconnects) and the serving object (tokenizer manager, SGLang's own chat
conversion); a request without the field is handed to the original method as it came. A
FastAPI middleware or route would have to re-parse and re-validate every request instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from sglang_specsot.sot.config import SoTConfig
from sglang_specsot.sot.runner import (
    PLAIN,
    SKELETON_CHANNEL,
    GenRequest,
    GenResult,
    RoutePhase,
    SoTAnswer,
    SoTOptions,
    SoTPhaseError,
    new_group,
    route_phase,
    run_sot,
)

logger = logging.getLogger(__name__)

FIELD = "specsot"
MODE_ENV = "SGLANG_SPECSOT_SOT_MODE"
FIELD_KEYS = ("mode", "config", "skeleton_logit_processor")
HOOK_TARGET = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat.handle_request"
_HTTP_LAUNCHERS = ("sglang/launch_server.py", "sglang/cli/serve.py")
_installed = False


# -- installation ----------------------------------------------------------------------------


def install_sot_server() -> bool:
    """Hook server-side SoT into the chat route when this process runs SGLang's HTTP server.

    Idempotent; a no-op (False) in scheduler, detokenizer and non-HTTP processes.
    """
    global _installed
    if _installed or not _in_http_launcher():
        return _installed
    try:
        default_mode()
    except ValueError as exc:
        # SystemExit passes load_plugins' `except Exception`: fail at start-up, not per request.
        raise SystemExit(f"sglang-specsot: {exc}") from None
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(HOOK_TARGET, _around_handle_request, HookType.AROUND)
    _installed = True
    return True


def _in_http_launcher() -> bool:
    # The launchers call load_plugins() under `if __name__ == "__main__"`, so only the
    # server's main process has them on its stack; spawned children do not.
    return any(
        frame.filename.replace(os.sep, "/").endswith(_HTTP_LAUNCHERS)
        for frame in traceback.extract_stack()
    )


def default_mode() -> str:
    """The mode of requests without the field, from SGLANG_SPECSOT_SOT_MODE (default "off")."""
    mode = os.environ.get(MODE_ENV, "off").strip().lower()
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"{MODE_ENV}={mode!r} is not one of 'auto', 'on', 'off'")
    return mode


# -- the request field -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SoTField:
    """The parsed `specsot` field (or the server default when the request has none)."""

    mode: str
    config: SoTConfig
    skeleton_logit_processor: str | None = None

    def options(self, max_new_tokens: int | None) -> SoTOptions:
        return SoTOptions(self.mode, self.config, max_new_tokens, self.skeleton_logit_processor)


def parse_field(body: bytes | None, default: str) -> SoTField:
    """Read the `specsot` field from a raw JSON body; ValueError (HTTP 400) when malformed."""
    value = None
    if body and f'"{FIELD}"'.encode() in body:  # cheap test first: most requests lack it
        payload = json.loads(body)
        value = payload.get(FIELD) if isinstance(payload, dict) else None
    if value is None:
        return SoTField(default, SoTConfig())
    if not isinstance(value, dict):
        raise ValueError(
            f'"{FIELD}" must be an object such as {{"mode": "auto"}}, got {json.dumps(value)}'
        )
    unknown = sorted(set(value) - set(FIELD_KEYS))
    if unknown:
        raise ValueError(f'"{FIELD}" has unknown keys {unknown}; known keys are {list(FIELD_KEYS)}')
    mode = value.get("mode", "auto")
    if mode not in ("auto", "on", "off"):
        raise ValueError(f'"{FIELD}.mode" must be "auto", "on" or "off", got {json.dumps(mode)}')
    return SoTField(mode, _config(value.get("config")), _processor(value))


def _config(overrides: object) -> SoTConfig:
    if overrides is None:
        return SoTConfig()
    if not isinstance(overrides, dict):
        raise ValueError(f'"{FIELD}.config" must be an object of SoTConfig fields, got {json.dumps(overrides)}')
    known = set(SoTConfig.__dataclass_fields__)
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f'"{FIELD}.config" has unknown fields {unknown}; SoTConfig has {sorted(known)}')
    return SoTConfig(**overrides)  # its own checks raise ValueError naming the field


def _processor(value: dict) -> str | None:
    processor = value.get("skeleton_logit_processor")
    if processor is not None and not (isinstance(processor, str) and processor):
        raise ValueError(
            f'"{FIELD}.skeleton_logit_processor" must be a serialized CustomLogitProcessor string'
        )
    return processor


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


# -- the hook ----------------------------------------------------------------------------------


async def _around_handle_request(original, serving, request, raw_request):
    """OpenAIServingChat.handle_request, answering opted-in requests by SoT."""
    try:
        body = await raw_request.body() if raw_request is not None else None
        field = parse_field(body, default_mode())
    except ValueError as exc:
        return serving.create_error_response(str(exc), err_type="BadRequest", status_code=400)
    if field.mode == "off":
        return await original(serving, request, raw_request)
    return await _SoTChat(serving, request, raw_request, field).respond(original)


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
        error = self.serving._validate_request(self.request)
        if error:
            return self._error(error)
        try:
            adapted, _ = self.serving._convert_to_internal_request(self.request, self.raw_request)
        except ValueError as exc:
            return self._error(str(exc))
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
        return self._response(answer)

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

    def _response(self, answer: SoTAnswer):
        from sglang.srt.entrypoints.openai.protocol import (
            ChatCompletionResponse,
            ChatCompletionResponseChoice,
            ChatMessage,
        )

        message = ChatMessage(role="assistant", content=answer.answer, reasoning_content=_skeleton_text(answer))
        choice = ChatCompletionResponseChoice(index=0, message=message, finish_reason=answer.finish_reason)
        return ChatCompletionResponse(
            id=self._id, model=self.request.model, choices=[choice], usage=_usage(answer),
            metadata={FIELD: answer.trace()},
        )  # fmt: skip

    @property
    def _id(self) -> str:
        return f"chatcmpl-specsot-{self.group}"

    async def _streaming(self, run: Callable):
        from fastapi.responses import StreamingResponse

        stream = _SoTStream(self, run)
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


def _skeleton_text(answer: SoTAnswer) -> str | None:
    return answer.skeleton.text if answer.skeleton is not None else None


def _usage(answer: SoTAnswer):
    from sglang.srt.entrypoints.openai.protocol import UsageInfo

    prompt, completion = answer.prompt_tokens, answer.completion_tokens
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


class _SoTStream:
    """Runs the SoT answer as a task and turns its deltas into OpenAI SSE chunks."""

    def __init__(self, chat: _SoTChat, run: Callable) -> None:
        self.chat = chat
        self.queue: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue()
        self.task = asyncio.create_task(run(lambda channel, text: self.queue.put_nowait((channel, text))))
        self.task.add_done_callback(lambda _: self.queue.put_nowait(None))
        self.created = int(time.time())

    async def start(self) -> list[tuple[str, str]]:
        """Wait for the skeleton's first token (after its pre-fill) or the end of the answer."""
        first: list[tuple[str, str]] = []
        while len(first) < 2:
            item = await self.queue.get()
            if item is None:
                self.queue.put_nowait(None)
                break
            first.append(item)
        if self.task.done() and self.task.exception() is not None:
            raise self.task.exception()
        return first

    async def chunks(self, first: list[tuple[str, str]]) -> AsyncIterator[str]:
        try:
            yield self._chunk({"role": "assistant", "content": ""})
            for item in first:
                if delta := self._delta(item):
                    yield delta
            while (item := await self.queue.get()) is not None:
                if delta := self._delta(item):
                    yield delta
            answer = self.task.result()
            yield self._chunk({}, finish_reason=answer.finish_reason)
            if self._include_usage():
                yield self._usage_chunk(answer)
        except SoTPhaseError as exc:
            yield f"data: {self.chat.serving.create_streaming_error_response(str(exc))}\n\n"
        finally:
            await self._stop()
        yield "data: [DONE]\n\n"

    def _delta(self, item: tuple[str, str]) -> str:
        channel, text = item
        if not text:
            return ""
        key = "reasoning_content" if channel == SKELETON_CHANNEL else "content"
        return self._chunk({key: text})

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> str:
        from sglang.srt.entrypoints.openai.protocol import (
            ChatCompletionResponseStreamChoice,
            ChatCompletionStreamResponse,
            DeltaMessage,
        )

        choice = ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(**delta), finish_reason=finish_reason)
        chunk = ChatCompletionStreamResponse(id=self.chat._id, created=self.created,
                                             model=self.chat.request.model, choices=[choice])  # fmt: skip
        return f"data: {chunk.model_dump_json()}\n\n"

    def _include_usage(self) -> bool:
        options = self.chat.request.stream_options
        return bool(options and options.include_usage)

    def _usage_chunk(self, answer: SoTAnswer) -> str:
        from sglang.srt.entrypoints.openai.protocol import ChatCompletionStreamResponse

        chunk = ChatCompletionStreamResponse(id=self.chat._id, created=self.created,
                                             model=self.chat.request.model, choices=[], usage=_usage(answer))  # fmt: skip
        return f"data: {chunk.model_dump_json()}\n\n"

    async def _stop(self) -> None:
        """Cancel the answer if the client left (the runner then cancels its branches)."""
        if not self.task.done():
            self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


# -- the backend -------------------------------------------------------------------------------


class TokenizerManagerBackend:
    """Runs GenRequests through SGLang's TokenizerManager, as /generate would.

    Sampling settings are the chat request's own (SGLang's conversion, so defaults and stop
    strings match a normal answer); only the budget and the SoT tag differ per generation.
    The raw request goes along so SGLang aborts generations whose client disconnected, and
    cancelling a generation aborts it in the scheduler (tokenizer_manager.py:952-962).
    """

    def __init__(self, tokenizer_manager, chat_input, raw_request, group: str) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.chat_input = chat_input  # SGLang's GenerateReqInput for the whole chat request
        self.raw_request = raw_request
        self.group = group
        self.count = 0

    async def generate(self, request: GenRequest, on_text: Callable[[str], None] | None = None) -> GenResult:
        obj = self._input(request, stream=on_text is not None)
        incremental = self.tokenizer_manager.incremental_streaming_output
        text, last = "", None
        async for out in self.tokenizer_manager.generate_request(obj, self.raw_request):
            piece = out["text"] if incremental and obj.stream else out["text"][len(text) :]
            text += piece
            last = out
            if on_text is not None and piece:
                on_text(piece)
        return _result(text, last["meta_info"])

    def _input(self, request: GenRequest, stream: bool):
        from dataclasses import replace

        from sglang.srt.managers.io_struct import GenerateReqInput

        self.count += 1
        rid = f"specsot-{self.group}-{request.tag.role}-{self.count}"
        params = self._sampling_params(request)
        if request.tag.role == PLAIN:  # SGLang's own rendering and tokenization of the chat
            return replace(self.chat_input, rid=rid, stream=stream, sampling_params=params)
        return GenerateReqInput(
            text=request.prompt, sampling_params=params, stream=stream, rid=rid,
            custom_logit_processor=request.logit_processor, lora_path=self.chat_input.lora_path,
        )  # fmt: skip

    def _sampling_params(self, request: GenRequest) -> dict:
        params = dict(self.chat_input.sampling_params or {})
        if request.max_new_tokens is not None:
            params["max_new_tokens"] = request.max_new_tokens
        params["custom_params"] = {**(params.get("custom_params") or {}), **request.tag.to_custom_params()}
        return params


def _result(text: str, meta: dict) -> GenResult:
    finish = meta.get("finish_reason") or {}
    if finish.get("type") == "abort":
        raise ValueError(finish.get("message") or "the generation was aborted")
    return GenResult(text, meta.get("prompt_tokens", 0), meta.get("completion_tokens", 0), finish.get("type", "stop"))
