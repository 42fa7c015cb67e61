"""The server-wide gate on concurrent SoT answers: FIFO beyond max_groups, 429 beyond the queue."""

from __future__ import annotations

import asyncio

import pytest

from sglang_specsot.serving.gate import GateFull, GroupGate


async def _hold(gate: GroupGate, name: str, log: list[str], release: asyncio.Event) -> None:
    async with gate.slot():
        log.append(name)
        await release.wait()


async def _holder_and_waiter(gate: GroupGate, log: list[str], release: asyncio.Event):
    """"a" holds the only slot and "b" waits for it, both already at the gate."""
    holder = asyncio.create_task(_hold(gate, "a", log, release))
    waiter = asyncio.create_task(_hold(gate, "b", log, release))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return holder, waiter


def test_answers_beyond_the_bound_wait_in_order_and_beyond_the_queue_are_refused():
    async def scenario():
        gate, log, release = GroupGate(running=2, waiting=2), [], asyncio.Event()
        tasks = [asyncio.create_task(_hold(gate, n, log, release)) for n in "abcd"]
        for _ in range(5):
            await asyncio.sleep(0)
        assert log == ["a", "b"] and gate.active == 2 and gate.queued == 2
        with pytest.raises(GateFull, match="max_groups=2.*max_waiting_groups=2"):
            async with gate.slot():
                pass
        release.set()
        await asyncio.gather(*tasks)
        assert log == ["a", "b", "c", "d"] and gate.active == 0 and gate.queued == 0

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_the_queue_and_the_slot_free():
    async def scenario():
        gate, log, release = GroupGate(running=1, waiting=1), [], asyncio.Event()
        first, waiter = await _holder_and_waiter(gate, log, release)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert gate.queued == 0
        release.set()
        await first
        async with gate.slot():
            assert gate.active == 1

    asyncio.run(scenario())


def test_a_reservation_takes_a_free_slot_at_once_and_none_when_all_are_taken():
    async def scenario():
        gate = GroupGate(running=2, waiting=2)
        first, second = await gate.reserve(), await gate.reserve()
        assert first is not None and second is not None
        assert await gate.reserve() is None  # both slots reserved: an answer would wait
        first.release()
        first.release()  # once only
        third = await gate.reserve()
        assert third is not None and await gate.reserve() is None
        async with gate.slot(second):
            assert gate.active == 1 and second.state == "used"
        second.release()  # used: its slot went back when the body ended, not again here
        assert gate.active == 0
        assert (await gate.reserve()) is not None and await gate.reserve() is None

    asyncio.run(scenario())


def test_requests_arriving_together_cannot_all_reserve_one_free_slot():
    """The race a check-then-take gate loses: every request checks the gate before any holds
    a slot. Here eight tasks reserve in the same turn of the event loop."""

    async def scenario():
        gate = GroupGate(running=3, waiting=8)
        # A racy reserve would pass the check for all eight, then block in acquire.
        got = await asyncio.wait_for(asyncio.gather(*(gate.reserve() for _ in range(8))), timeout=5)
        assert sum(r is not None for r in got) == 3

    asyncio.run(scenario())


def test_a_reservation_does_not_jump_answers_waiting_for_a_slot():
    async def scenario():
        gate, log, release = GroupGate(running=1, waiting=2), [], asyncio.Event()
        holder, waiter = await _holder_and_waiter(gate, log, release)
        assert await gate.reserve() is None  # "b" waits for the slot: a new answer would too
        release.set()
        await asyncio.gather(holder, waiter)
        assert log == ["a", "b"]

    asyncio.run(scenario())


def test_a_reservation_is_used_once():
    async def scenario():
        gate = GroupGate(running=1, waiting=1)
        reservation = await gate.reserve()
        async with gate.slot(reservation):
            pass
        with pytest.raises(RuntimeError, match="used once"):
            async with gate.slot(reservation):
                pass

    asyncio.run(scenario())
