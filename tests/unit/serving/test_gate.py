"""The server-wide gate on concurrent SoT answers: FIFO beyond max_groups, 429 beyond the queue."""

from __future__ import annotations

import asyncio

import pytest

from sglang_specsot.serving.gate import GateFull, GroupGate


async def _hold(gate: GroupGate, name: str, log: list[str], release: asyncio.Event) -> None:
    async with gate.slot():
        log.append(name)
        await release.wait()


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
        first = asyncio.create_task(_hold(gate, "a", log, release))
        waiter = asyncio.create_task(_hold(gate, "b", log, release))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert gate.queued == 0
        release.set()
        await first
        async with gate.slot():
            assert gate.active == 1

    asyncio.run(scenario())
