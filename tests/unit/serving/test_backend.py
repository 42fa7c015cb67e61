"""TokenizerManagerBackend over a fake TokenizerManager: a branch that loops is aborted there."""

from __future__ import annotations

import asyncio
from http import HTTPStatus

import pytest
from sglang.srt.managers.io_struct import GenerateReqInput

from sglang_specsot.serving.backend import TokenizerManagerBackend, _result
from sglang_specsot.serving.dp_placement import HomeRanks
from sglang_specsot.sot.phases import GenerationAborted, SoTPhaseError
from sglang_specsot.sot.phases import GenRequest, GenResult
from sglang_specsot.sot.tag import BRANCH, PLAIN, SKELETON, SoTTag

CLAUSE = "which would increase the number of people who had died from the plague, "


class _TokenizerManager:
    """Streams `text` a few characters per step, cumulative like SGLang's default; an abort
    ends the stream two steps later with SGLang's abort finish reason."""

    incremental_streaming_output = False
    context_len = 32_768

    class tokenizer:  # noqa: N801 - stands in for the HF tokenizer: one token per word
        encode = staticmethod(lambda text: text.split())

    def __init__(self, text: str, step: int = 6) -> None:
        self.text, self.step = text, step
        self.aborted: list[str] = []
        self.streamed: list[bool] = []
        self.inputs: list = []

    async def generate_request(self, obj, raw_request=None):
        self.streamed.append(obj.stream)
        self.inputs.append(obj)
        end, steps_after_abort = 0, 0
        while True:
            await asyncio.sleep(0)
            end = min(len(self.text), end + self.step)
            if self.aborted:
                steps_after_abort += 1
            done = end == len(self.text) or steps_after_abort == 2
            finish = {"type": "abort", "message": "Abort"} if self.aborted else {"type": "stop"}
            meta = {"prompt_tokens": 7, "completion_tokens": end // 4, "finish_reason": finish if done else None}
            if obj.stream or done:
                yield {"text": self.text[:end], "meta_info": meta}
            if done:
                return

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.aborted.append(rid)


def _backend(tm: _TokenizerManager) -> TokenizerManagerBackend:
    chat = GenerateReqInput(text="q", sampling_params={"temperature": 0.0})
    return TokenizerManagerBackend(tm, chat, None, "g1")


def _branch(stop_on_loop: bool = True) -> GenRequest:
    return GenRequest("prompt", 64, SoTTag("g1", BRANCH, 0, 2), stop_on_loop=stop_on_loop)


def test_a_looping_branch_is_aborted_in_the_scheduler_and_ends_as_a_loop():
    tm = _TokenizerManager("The plague spread fast, " + CLAUSE * 12)
    result = asyncio.run(_backend(tm).generate(_branch()))
    assert tm.aborted == ["specsot-g1-branch0-1"] and tm.streamed == [True]
    assert result.finish_reason == "loop" and result.text.count("which would") < 12
    assert result.prompt_tokens == 7 and result.completion_tokens == len(result.text) // 4


def test_a_branch_that_does_not_loop_runs_to_its_end():
    text = "Exercise strengthens the heart and lowers blood pressure. It also lifts mood."
    tm = _TokenizerManager(text)
    result = asyncio.run(_backend(tm).generate(_branch()))
    assert tm.aborted == [] and result.text == text and result.finish_reason == "stop"


def test_without_the_watch_a_loop_is_left_to_the_merge_and_nothing_streams():
    tm = _TokenizerManager(CLAUSE * 12)
    result = asyncio.run(_backend(tm).generate(_branch(stop_on_loop=False)))
    assert tm.aborted == [] and tm.streamed == [False] and result.text == CLAUSE * 12


POINT = ("A planner shows the whole week at a glance. It keeps deadlines in sight, so nothing is "
         "forgotten. Reviewing it each morning sets the day's priorities. It also helps")  # fmt: skip


def test_a_branch_past_its_aim_ends_at_its_next_sentence_and_keeps_the_text_up_to_it():
    tm = _TokenizerManager(POINT)  # four characters a token
    request = GenRequest("prompt", 64, SoTTag("g1", BRANCH, 0, 2), end_after=13)
    result = asyncio.run(_backend(tm).generate(request))
    # 13 tokens are reached at 54 characters, inside the second sentence: it is the last.
    assert result.text == "A planner shows the whole week at a glance. It keeps deadlines in sight, so nothing is forgotten."
    assert result.finish_reason == "aim" and tm.aborted == ["specsot-g1-branch0-1"] and tm.streamed == [True]
    assert result.completion_tokens > len(result.text) // 4  # the tokens decoded before the abort count


def test_a_branch_that_ends_before_its_aim_is_left_alone():
    text = "A planner shows the whole week."
    tm = _TokenizerManager(text)
    result = asyncio.run(_backend(tm).generate(GenRequest("prompt", 64, SoTTag("g1", BRANCH, 0, 2), end_after=40)))
    assert tm.aborted == [] and result.text == text and result.finish_reason == "stop"


def _normal(read_opening: int | None = 400) -> GenRequest:
    return GenRequest("prompt", 256, SoTTag("g1", PLAIN), read_opening=read_opening)


def test_a_normal_answer_announcing_a_list_ends_at_its_intro_line():
    tm = _TokenizerManager("A landlord can keep good tenants by doing several things:\n\n1. Answer repairs fast.\n2. Be fair.")
    result = asyncio.run(_backend(tm).generate(_normal()))
    assert result.text == "A landlord can keep good tenants by doing several things:"
    assert result.finish_reason == "opening" and tm.aborted == ["specsot-g1-plain-1"] and tm.streamed == [True]
    assert result.completion_tokens > len(result.text) // 4  # the tokens decoded before the abort count


@pytest.mark.parametrize("text", ["The legislative branch makes laws.\n\nThe executive enforces them.",
                                  "One short paragraph, and no line break at all."])  # fmt: skip
def test_a_normal_answer_in_prose_runs_to_its_end(text):
    tm = _TokenizerManager(text)
    result = asyncio.run(_backend(tm).generate(_normal()))
    assert tm.aborted == [] and result.text == text and result.finish_reason == "stop"


def test_without_read_opening_a_list_is_not_stopped():
    text = "Several things:\n1. Answer repairs fast."
    tm = _TokenizerManager(text)
    result = asyncio.run(_backend(tm).generate(_normal(None)))
    assert tm.aborted == [] and result.text == text and tm.streamed == [False]


def test_an_abort_the_backend_did_not_ask_for_is_an_abort_not_bad_input():
    tm = _TokenizerManager("Some text that is long enough to take several steps to stream out.")
    tm.aborted.append("someone else")  # /abort_request or a disconnect: no status code
    with pytest.raises(GenerationAborted, match="Abort") as info:
        asyncio.run(_backend(tm).generate(_branch(stop_on_loop=False)))
    assert info.value.status_code is None and not isinstance(info.value, ValueError)


@pytest.mark.parametrize("status, error", [(HTTPStatus.SERVICE_UNAVAILABLE, GenerationAborted),
                                           (HTTPStatus.INTERNAL_SERVER_ERROR, GenerationAborted),
                                           (HTTPStatus.BAD_REQUEST, ValueError)])  # fmt: skip
def test_an_abort_keeps_sglangs_status_and_only_a_400_is_bad_input(status, error):
    finish = {"type": "abort", "message": "Out of memory", "status_code": status}
    with pytest.raises(error, match="Out of memory") as info:
        _result("partial", {"finish_reason": finish})
    assert getattr(info.value, "status_code", 400) == status.value


@pytest.mark.parametrize("role, kept", [(SKELETON, False), (BRANCH, False), (PLAIN, True)])
def test_ignore_eos_holds_for_the_normal_answer_only(role, kept):
    # bench_serving sends ignore_eos=true unless told otherwise: a skeleton must still end.
    tm = _TokenizerManager("1. Plan\n2. Act")
    chat = GenerateReqInput(text="q", sampling_params={"temperature": 0.0, "ignore_eos": True, "top_p": 0.9})
    tag = SoTTag("g1", BRANCH, 0, 2) if role == BRANCH else SoTTag("g1", role)
    request = GenRequest("prompt", 32, tag)
    asyncio.run(TokenizerManagerBackend(tm, chat, None, "g1").generate(request))
    params = tm.inputs[0].sampling_params
    assert params["top_p"] == 0.9 and params["max_new_tokens"] == 32
    assert ("ignore_eos" in params) is kept


def test_a_generation_keeps_sglangs_verify_count_for_the_answers_accept_length():
    meta = {"prompt_tokens": 7, "completion_tokens": 30, "finish_reason": {"type": "stop"}, "spec_verify_ct": 12}
    result = _result("text", meta)
    assert result.verify_steps == 12 and result.completion_tokens == 30
    # A server that does not speculate sends no count (or None): no verify forwards, not a crash.
    assert _result("text", {**meta, "spec_verify_ct": None}).verify_steps == 0
    assert _result("text", {"completion_tokens": 3, "finish_reason": {"type": "stop"}}).verify_steps == 0


@pytest.mark.parametrize("role, words, budget, sent", [
    (BRANCH, 100, 64, 64),  # fits: the budget as planned
    (BRANCH, 990, 64, 34),  # the branch prompt leaves 34 tokens of a 1,024 context: clamped
    (SKELETON, 1_030, 64, 1),  # no room at all: SGLang's own refusal decides, as for a plain request
    # The normal answer a skeleton that is no plan falls back to: a budget the server chose is cut
    # as SGLang sizes a request without max_tokens (a client's own cap was checked before SoT).
    (PLAIN, 990, 64, 34),
])  # fmt: skip
def test_a_budget_is_cut_to_the_room_the_context_leaves(monkeypatch, role, words, budget, sent):
    tm = _TokenizerManager("An answer.")
    monkeypatch.setattr(tm, "context_len", 1_024, raising=False)
    tag = SoTTag("g1", BRANCH, 0, 2) if role == BRANCH else SoTTag("g1", role)
    asyncio.run(_backend(tm).generate(GenRequest("w " * words, budget, tag)))
    assert tm.inputs[0].sampling_params["max_new_tokens"] == sent


def _branches(n: int) -> dict[int, GenRequest]:
    shared = "Question: q\nSkeleton:\n1. a\n2. b\n"
    return {i: GenRequest(f"{shared}Write point {i + 1}.", 50, SoTTag("g1", BRANCH, i, n)) for i in range(n)}


def test_fork_branches_prefills_the_shared_prefix_once_before_any_branch():
    tm = _TokenizerManager("Point text.")
    backend = _backend(tm)
    requests = _branches(3)

    async def scenario():
        async with backend.fork_branches(requests):
            assert len(tm.inputs) == 1  # committed before the first branch is sent
            await asyncio.gather(*(backend.generate(r) for r in requests.values()))

    asyncio.run(scenario())
    commit = tm.inputs[0]
    assert commit.text == "Question: q\nSkeleton:\n1. a\n2. b\n"
    assert commit.sampling_params == {"max_new_tokens": 0}  # no grammar or stop strings to set up
    assert "prefix" in commit.rid and commit.stream is False
    assert [o.text for o in tm.inputs[1:]] == [r.prompt for r in requests.values()]


def test_fork_branches_skips_the_commit_for_a_single_branch_or_no_common_line():
    tm = _TokenizerManager("Point text.")
    backend = _backend(tm)
    unrelated = {0: GenRequest("abc", 5, SoTTag("g1", BRANCH, 0, 2)), 1: GenRequest("abd", 5, SoTTag("g1", BRANCH, 1, 2))}

    async def scenario():
        for requests in (_branches(1), unrelated):
            async with backend.fork_branches(requests):
                pass

    asyncio.run(scenario())
    assert tm.inputs == []


def test_a_prefix_commit_the_server_aborts_fails_like_a_branch():
    tm = _TokenizerManager("x")
    tm.aborted.append("earlier")  # every generation of this fake ends as an abort
    backend = _backend(tm)

    async def scenario():
        async with backend.fork_branches(_branches(2)):
            raise AssertionError("the branches must not start after a failed commit")

    with pytest.raises(SoTPhaseError) as failed:
        asyncio.run(scenario())
    # Wrapped as a branch failure is, so the chat route answers it with the same status.
    assert isinstance(failed.value.cause, GenerationAborted) and "shared prefix" in str(failed.value)


def _dp_backend(monkeypatch, placement: str, ranks: int = 2) -> tuple[_TokenizerManager, TokenizerManagerBackend]:
    monkeypatch.setenv("SGLANG_SPECSOT_DP_BRANCHES", placement)
    monkeypatch.setattr("sglang_specsot.serving.dp_placement._homes", HomeRanks())  # the first home is rank 0
    tm = _TokenizerManager("Point text.")
    tm.elastic_worker_count = ranks
    return tm, _backend(tm)


def _run_answer(backend: TokenizerManagerBackend, requests: dict[int, GenRequest]) -> list[GenResult]:
    async def scenario():
        await backend.generate(GenRequest("Question: q\nSkeleton:", 20, SoTTag("g1", SKELETON)))
        async with backend.fork_branches(requests):
            return await asyncio.gather(*(backend.generate(r) for r in requests.values()))

    return asyncio.run(scenario())


def test_spread_commits_the_prefix_on_every_rank_in_use_then_deals_the_branches(monkeypatch):
    tm, backend = _dp_backend(monkeypatch, "spread")
    results = _run_answer(backend, _branches(3))
    skeleton, commits, branches = tm.inputs[0], tm.inputs[1:3], tm.inputs[3:]
    assert skeleton.routed_dp_rank == 0
    assert sorted(c.routed_dp_rank for c in commits) == [0, 1]
    assert all(c.sampling_params == {"max_new_tokens": 0} for c in commits)
    assert [b.routed_dp_rank for b in branches] == [0, 1, 0]
    assert [r.dp_rank for r in results] == [0, 1, 0]  # each branch's metadata names its rank


def test_keep_runs_skeleton_commit_and_branches_on_one_rank(monkeypatch):
    tm, backend = _dp_backend(monkeypatch, "keep")
    _run_answer(backend, _branches(3))
    assert [o.routed_dp_rank for o in tm.inputs] == [0] * 5  # skeleton, one commit, three branches


def test_on_one_rank_nothing_is_pinned(monkeypatch):
    tm, backend = _dp_backend(monkeypatch, "spread", ranks=1)
    results = _run_answer(backend, _branches(2))
    assert [o.routed_dp_rank for o in tm.inputs] == [None] * 4
    assert all(r.dp_rank is None for r in results)
