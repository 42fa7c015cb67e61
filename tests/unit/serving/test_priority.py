"""An admitted SoT answer's branches run one priority step ahead of their request, only where
the server schedules by priority."""

from __future__ import annotations

import asyncio

import pytest
from sglang.srt.managers.io_struct import GenerateReqInput

from sglang_specsot.serving import backend as backend_module
from sglang_specsot.serving.backend import TokenizerManagerBackend
from sglang_specsot.serving.priority import branch_priority
from sglang_specsot.sot.phases import GenRequest
from sglang_specsot.sot.tag import BRANCH, SKELETON, SoTTag
from tests.unit.serving.test_backend import _TokenizerManager


@pytest.mark.parametrize(
    ("enabled", "request_priority", "default", "low_first", "want"),
    [
        (False, 5, None, False, None),  # no priority scheduling: SGLang's order, untouched
        (True, None, None, False, 1),  # unset and no default: SGLang's 0, one ahead
        (True, None, 10, False, 11),  # unset: the server's default, one ahead
        (True, 5, 10, False, 6),  # the client's own priority, one ahead
        (True, 5, None, True, 4),  # low values first: one ahead is one lower
    ],
)
def test_branch_priority_is_one_step_ahead_of_its_request(enabled, request_priority, default, low_first, want):
    assert branch_priority(enabled, request_priority, default, low_first) == want


def _priorities(monkeypatch, settings, chat_priority) -> dict[str, int | None]:
    monkeypatch.setattr(backend_module.sgl, "priority_settings", lambda tm: settings)
    tm = _TokenizerManager("1. Plan\n2. Act")
    chat = GenerateReqInput(text="q", sampling_params={"temperature": 0.0}, priority=chat_priority)
    backend = TokenizerManagerBackend(tm, chat, None, "g1")
    asyncio.run(backend.generate(GenRequest("skeleton prompt", 32, SoTTag("g1", SKELETON))))
    branches = {i: GenRequest(f"shared prompt\npoint {i}", 32, SoTTag("g1", BRANCH, i, 2)) for i in range(2)}

    async def fork_and_run():
        async with backend.fork_branches(branches):
            for request in branches.values():
                await backend.generate(request)

    asyncio.run(fork_and_run())
    return {obj.rid.split("-")[2]: obj.priority for obj in tm.inputs}


def test_with_priority_scheduling_the_branches_and_their_prefix_go_first(monkeypatch):
    got = _priorities(monkeypatch, (True, None, False), chat_priority=3)
    assert got == {"skeleton": 3, "prefix": 4, "branch0": 4, "branch1": 4}  # a branch's rid names its point


def test_without_it_no_generation_carries_a_priority(monkeypatch):
    got = _priorities(monkeypatch, (False, None, False), chat_priority=None)
    assert got == {"skeleton": None, "prefix": None, "branch0": None, "branch1": None}
