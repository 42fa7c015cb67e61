"""An SoT answer as SGLang's OpenAI chat objects: the completion, stream chunks, usage."""

from __future__ import annotations

from http import HTTPStatus

from sglang_specsot.host import adapter as sgl
from sglang_specsot.serving.field import FIELD
from sglang_specsot.sot.phases import GenerationAborted, SoTPhaseError
from sglang_specsot.sot.runner import SoTAnswer


def usage(answer: SoTAnswer):
    """Every prompt and generated token of the answer: skeleton, branches or the normal answer."""
    prompt, completion = answer.prompt_tokens, answer.completion_tokens
    return sgl.UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def chat_completion(answer: SoTAnswer, response_id: str, model: str):
    """The non-streamed response: the skeleton as `reasoning_content`, the trace as metadata."""
    skeleton = answer.skeleton.text if answer.skeleton is not None else None
    message = sgl.ChatMessage(role="assistant", content=answer.answer, reasoning_content=skeleton)
    choice = sgl.ChatCompletionResponseChoice(index=0, message=message, finish_reason=answer.finish_reason)
    return sgl.ChatCompletionResponse(
        id=response_id, model=model, choices=[choice], usage=usage(answer), metadata={FIELD: answer.trace()}
    )


def stream_chunk(response_id: str, created: int, model: str, delta: dict, finish_reason: str | None = None) -> str:
    """One SSE event carrying `delta` (a DeltaMessage's fields)."""
    choice = sgl.ChatCompletionResponseStreamChoice(
        index=0, delta=sgl.DeltaMessage(**delta), finish_reason=finish_reason
    )
    chunk = sgl.ChatCompletionStreamResponse(id=response_id, created=created, model=model, choices=[choice])
    return f"data: {chunk.model_dump_json()}\n\n"


def usage_chunk(answer: SoTAnswer, response_id: str, created: int, model: str) -> str:
    """The SSE event with the answer's usage (OpenAI's `stream_options.include_usage`)."""
    chunk = sgl.ChatCompletionStreamResponse(
        id=response_id, created=created, model=model, choices=[], usage=usage(answer)
    )
    return f"data: {chunk.model_dump_json()}\n\n"


def error_status(exc: SoTPhaseError) -> int | None:
    """The HTTP status SGLang's chat route gives the failure of a phase; None for a graceful
    abort (`/abort_request`, a disconnect), which it answers with finish_reason "abort"."""
    cause = exc.cause
    if isinstance(cause, ValueError):  # what SGLang raises for bad input (e.g. too long)
        return 400
    # GenerationAborted, or fastapi's HTTPException for a non-streamed generation's abort
    # with a status (tokenizer_manager.py:1919).
    status = getattr(cause, "status_code", None)
    if isinstance(cause, GenerationAborted) and status is None:
        return None
    return int(status) if isinstance(status, int) else 500


def error_type(status: int) -> str:
    """The `type` of an error body: SGLang's names for 400 and 500, else the status's name."""
    return {400: "BadRequest", 500: "InternalServerError"}.get(status) or HTTPStatus(status).name


def aborted_completion(exc: SoTPhaseError, response_id: str, model: str):
    """A non-streamed answer a graceful abort ended: empty, finish_reason "abort", as SGLang
    answers an aborted chat request; `metadata.specsot.aborted` says which phase."""
    message = sgl.ChatMessage(role="assistant", content="")
    choice = sgl.ChatCompletionResponseChoice(index=0, message=message, finish_reason="abort")
    return sgl.ChatCompletionResponse(
        id=response_id, model=model, choices=[choice],
        usage=sgl.UsageInfo(prompt_tokens=0, completion_tokens=0, total_tokens=0),
        metadata={FIELD: {"aborted": str(exc)}},
    )  # fmt: skip
