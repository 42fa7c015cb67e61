"""The server-wide bound on SoT answers running at once (limits `max_groups`).

One SoT answer runs up to `max_running` branches, so without a bound a burst of SoT requests
fills every batch slot and plain requests queue behind their branches (the issue measured SoT
p95 184 s against plain 42 s). Answers beyond `max_groups` wait for a slot in arrival order;
beyond `max_waiting_groups` waiting, the request is refused at once with HTTP 429, since a
queue without a bound only moves the overload into memory and client timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from sglang_specsot.sot.limits import LIMITS_ENV


class GateFull(Exception):
    """Every SoT slot is taken and the waiting queue is full: answer HTTP 429."""


class GroupGate:
    """At most `running` SoT answers at once, at most `waiting` more queued (FIFO)."""

    def __init__(self, running: int, waiting: int) -> None:
        self.running, self.waiting = running, waiting
        self.queued = 0
        self.active = 0
        self._slots: asyncio.Semaphore | None = None  # made in the server's event loop

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one SoT slot for the body; GateFull when none is free and the queue is full."""
        slots = self._slots = self._slots or asyncio.Semaphore(self.running)
        if slots.locked() and self.queued >= self.waiting:
            raise GateFull(
                f"the server is running {self.active} SoT answers (limit max_groups="
                f"{self.running}) with {self.queued} more waiting (limit max_waiting_groups="
                f"{self.waiting}); retry later, or send the request without SoT "
                f'("specsot": {{"mode": "off"}}). The operator sets limits in {LIMITS_ENV}.'
            )
        self.queued += 1
        try:
            await slots.acquire()
        finally:
            self.queued -= 1
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            slots.release()
