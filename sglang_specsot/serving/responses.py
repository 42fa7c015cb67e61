"""An SoT answer as SGLang's OpenAI chat objects: the completion, stream chunks, usage."""

from __future__ import annotations

from sglang_specsot.serving.field import FIELD
from sglang_specsot.sot.runner import SoTAnswer
from sglang_specsot.speculative import adapter as sgl


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
