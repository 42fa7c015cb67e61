"""A streamed SoT answer as OpenAI server-sent events.

Order: the skeleton first, token by token, as `reasoning_content` deltas (starting with its
pre-filled "1."); then the answer as `content` deltas, one whole point at a time in skeleton
order: a point is sent once its branch and all earlier points are done (a finished later point
waits). So the concatenated deltas equal the non-streamed message exactly. When the skeleton
is unusable the normal answer follows as `content` deltas, token by token.

A failure after the stream began ends it as SGLang's chat route ends its own streams: a
graceful abort (`/abort_request`) with a last chunk whose finish_reason is "abort"; any other
failure with SGLang's error event carrying its status (400 for bad input, 503 for a
scheduler out of memory, 500 otherwise), then `[DONE]`.
"""

from __future__ import annotations

import asyncio
import time
from http import HTTPStatus
from collections.abc import AsyncIterator, Callable

from sglang_specsot.serving.responses import error_status, stream_chunk, usage_chunk
from sglang_specsot.sot.runner import SKELETON_CHANNEL, SoTAnswer, SoTPhaseError

# (channel, text) as the runner reports it; None once the answer is done.
Delta = tuple[str, str]


class SoTStream:
    """Runs the SoT answer as a task and turns its deltas into OpenAI SSE chunks.

    `run(on_delta)` starts the answer; `error_event(message, type, status)` is SGLang's
    streaming error body.
    """

    def __init__(self, run: Callable, response_id: str, model: str, include_usage: bool,
                 error_event: Callable[[str], str]) -> None:  # fmt: skip
        self.response_id, self.model, self.include_usage = response_id, model, include_usage
        self.error_event = error_event
        self.queue: asyncio.Queue[Delta | None] = asyncio.Queue()
        self.task = asyncio.create_task(run(lambda channel, text: self.queue.put_nowait((channel, text))))
        self.task.add_done_callback(lambda _: self.queue.put_nowait(None))
        self.created = int(time.time())

    async def start(self) -> list[Delta]:
        """Wait for the skeleton's first token (after its pre-fill) or the end of the answer;
        a failure by then is raised (an HTTP error), bar a graceful abort, which streams."""
        first: list[Delta] = []
        while len(first) < 2:
            item = await self.queue.get()
            if item is None:
                self.queue.put_nowait(None)
                break
            first.append(item)
        exc = self.task.exception() if self.task.done() else None
        if exc is not None and not (isinstance(exc, SoTPhaseError) and error_status(exc) is None):
            raise exc
        return first

    async def chunks(self, first: list[Delta]) -> AsyncIterator[str]:
        try:
            yield self._chunk({"role": "assistant", "content": ""})
            for item in first:
                if delta := self._delta(item):
                    yield delta
            while (item := await self.queue.get()) is not None:
                if delta := self._delta(item):
                    yield delta
            answer: SoTAnswer = self.task.result()
            yield self._chunk({}, finish_reason=answer.finish_reason)
            if self.include_usage:
                yield usage_chunk(answer, self.response_id, self.created, self.model)
        except SoTPhaseError as exc:
            yield self._failure(exc)
        finally:
            await self._stop()
        yield "data: [DONE]\n\n"

    def _failure(self, exc: SoTPhaseError) -> str:
        status = error_status(exc)
        if status is None:
            return self._chunk({}, finish_reason="abort")
        if status == 400:  # SGLang's streams answer a ValueError with the default error event
            return f"data: {self.error_event(str(exc))}\n\n"
        # and an abort with a status by naming it in `type` (serving_chat.py:2568-2578).
        return f"data: {self.error_event(str(exc), HTTPStatus(status).name, status)}\n\n"

    def _delta(self, item: Delta) -> str:
        channel, text = item
        if not text:
            return ""
        key = "reasoning_content" if channel == SKELETON_CHANNEL else "content"
        return self._chunk({key: text})

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> str:
        return stream_chunk(self.response_id, self.created, self.model, delta, finish_reason)

    async def _stop(self) -> None:
        """Cancel the answer if the client left (the runner then cancels its branches)."""
        if not self.task.done():
            self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
