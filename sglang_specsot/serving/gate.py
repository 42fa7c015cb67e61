"""The server-wide bound on SoT answers running at once (limits `max_groups`).

One SoT answer runs up to `max_running` branches, so without a bound a burst of SoT requests
fills every batch slot and plain requests queue behind their branches, their latency set by
other answers' branches. Answers beyond `max_groups` wait for a slot in arrival order;
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

    def _semaphore(self) -> asyncio.Semaphore:
        self._slots = self._slots or asyncio.Semaphore(self.running)
        return self._slots

    async def reserve(self) -> Reservation | None:
        """A slot taken now, or None when an answer starting now would wait for one.

        The check and the taking happen without yielding to the event loop (a free
        semaphore's acquire returns at once), so requests arriving together cannot all see
        the same free slot and all choose SoT before any of them holds it."""
        slots = self._semaphore()
        if slots.locked():  # no free slot, or answers already waiting for one
            return None
        await slots.acquire()
        return Reservation(self)

    @contextlib.asynccontextmanager
    async def slot(self, reservation: Reservation | None = None) -> AsyncIterator[None]:
        """Hold one SoT slot for the body (the reserved one, if given); GateFull when none is
        free and the queue is full."""
        slots = self._semaphore()
        if reservation is not None:
            reservation.use()
        else:
            await self._acquire(slots)
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            slots.release()

    async def _acquire(self, slots: asyncio.Semaphore) -> None:
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


class Reservation:
    """A slot taken while routing: `GroupGate.slot` uses it, or `release` gives it back (a
    request that fails before its answer starts); releasing a used one does nothing."""

    def __init__(self, gate: GroupGate) -> None:
        self.gate, self.state = gate, "held"

    def use(self) -> None:
        if self.state != "held":
            raise RuntimeError(f"a reservation can be used once, while held; it is {self.state}")
        self.state = "used"

    def release(self) -> None:
        if self.state == "held":
            self.state = "released"
            self.gate._semaphore().release()
