"""The backend an SoT answer generates on, and the branch phase: the plan's branches run
concurrently within its limit, each retried once where it asks, none outliving the answer.

`SoTBackend` is the server's TokenizerManager (server-side SoT), the frontend program's
interpreter state (a `ForkingBackend`), or a fake in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from sglang_specsot.sot.phase_steps import usable_text
from sglang_specsot.sot.phases import BranchesPhase, BranchResult, GenRequest, GenResult, SoTPhaseError
from sglang_specsot.sot.planner import BranchPlan

logger = logging.getLogger(__name__)

Retry = Callable[[GenRequest, GenResult], "GenRequest | None"]  # a branch's second request, if it needs one


class SoTBackend(Protocol):
    """Anything that can run a GenRequest; `on_text` gets each new piece of text as it decodes.

    For role "plain" a backend may send its own rendering of the same one-turn chat (the
    server uses SGLang's chat conversion, so a plain answer is what /v1/chat/completions gives).
    """

    async def generate(
        self, request: GenRequest, on_text: Callable[[str], None] | None = None
    ) -> GenResult: ...


@runtime_checkable
class ForkingBackend(SoTBackend, Protocol):
    """A backend that prefills the branches' shared prompt prefix once (the frontend's `fork`).

    `run_branches` enters `fork_branches(requests)` before the first branch starts and leaves
    it after the last one ended. SGLang's radix cache shares only what is already cached
    when a request is scheduled: branches admitted in one prefill batch would each prefill
    the whole prefix (question and skeleton) again, so both backends commit it first.
    """

    def fork_branches(
        self, requests: dict[int, GenRequest]
    ) -> contextlib.AbstractAsyncContextManager[None]: ...


async def generate(
    backend: SoTBackend, request: GenRequest, phase: str, on_text: Callable[[str], None] | None
) -> GenResult:
    try:
        return await backend.generate(request, on_text)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        raise SoTPhaseError(phase, exc) from exc


async def run_branches(
    backend: SoTBackend,
    plan: BranchPlan,
    requests: dict[int, GenRequest],
    on_finish: Callable[[int, str], None] | None = None,
    retry: Retry | None = None,
) -> BranchesPhase:
    """Run the plan's branches, at most `plan.max_running` at once, starting waiting ones as
    others finish; a branch for which `retry` returns a second request runs once more, in
    the slot it had. On any failure or cancellation every running branch is cancelled."""
    started = time.perf_counter()  # the phase includes committing the shared prefix
    scope = backend.fork_branches(requests) if isinstance(backend, ForkingBackend) else _no_fork()
    async with scope:
        return await _run_branches(backend, plan, requests, on_finish, started, retry)


@contextlib.asynccontextmanager
async def _no_fork():
    yield


async def _run_branches(
    backend: SoTBackend,
    plan: BranchPlan,
    requests: dict[int, GenRequest],
    on_finish: Callable[[int, str], None] | None,
    started: float,
    retry: Retry | None = None,
) -> BranchesPhase:
    scheduler = plan.scheduler()
    requests = dict(requests)  # a retried branch's entry becomes its second request
    first_tries: dict[int, GenResult] = {}
    running: dict[int, asyncio.Task] = {}
    started_at: dict[int, float] = {}
    done: dict[int, BranchResult] = {}
    order: list[int] = []
    peak = 0
    try:
        while not scheduler.is_done(done):
            for branch in scheduler.next_to_start(running, done):
                started_at[branch.index] = time.perf_counter() - started
                running[branch.index] = asyncio.create_task(backend.generate(requests[branch.index]))
                order.append(branch.index)
            peak = max(peak, len(running))
            finished, _ = await asyncio.wait(running.values(), return_when=asyncio.FIRST_COMPLETED)
            for index in sorted(i for i, task in running.items() if task in finished):
                result = _branch_result(running.pop(index), index)
                again = retry(requests[index], result) if retry is not None and index not in first_tries else None
                if again is not None:  # still running, in the slot it had: no other branch waits longer
                    logger.info("SoT branch %d wrote only its title; asking once more", index + 1)
                    first_tries[index], requests[index] = result, again
                    running[index] = asyncio.create_task(backend.generate(again))
                    continue
                branch = BranchResult(
                    index, plan.points[index], requests[index], result,
                    started_at[index], time.perf_counter() - started, first_tries.get(index),
                )  # fmt: skip
                done[index] = branch
                if on_finish is not None:
                    on_finish(index, usable_text(result))
    finally:
        await cancel(running.values())
    results = tuple(done[i] for i in sorted(done))
    return BranchesPhase(plan, results, tuple(order), peak, time.perf_counter() - started)


def _branch_result(task: asyncio.Task, index: int) -> GenResult:
    exc = task.exception()
    if exc is not None:
        raise SoTPhaseError(f"branch {index + 1}", exc) from exc
    return task.result()


async def cancel(tasks: Iterable[asyncio.Task]) -> None:
    """Cancel and await the tasks, so none outlives its answer (the backend aborts them)."""
    tasks = list(tasks)
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    # Gathering the finished ones too marks their exceptions as retrieved.
    await asyncio.gather(*tasks, return_exceptions=True)
    if pending:
        logger.info("cancelled %d running SoT generations", len(pending))
