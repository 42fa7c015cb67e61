"""The normal answer's first line decides whether SoT answers (sot.opening), read by the
runner beside the skeleton, with a fake backend that ends a generation as the server's does."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from sglang_specsot.sot import SoTConfig
from sglang_specsot.sot.opening import INTRO, ITEM, PROSE, OpeningWatch, read_opening
from sglang_specsot.sot.runner import (
    ANSWER_CHANNEL,
    BRANCH,
    NORMAL,
    PLAIN,
    SKELETON,
    SKELETON_CHANNEL,
    SOT,
    GenResult,
    SoTOptions,
    SoTPhaseError,
    run_sot,
)
from sglang_specsot.sot.budget import POINT_AIM_TOKENS
from tests.unit.sot.test_runner import QUESTION, FakeBackend, render

INTRO_ANSWER = ("Learning Python offers several benefits, including:\n\n1. **Ease of use**: Its syntax is "
                "simple.\n2. **Libraries**: pandas and NumPy.")  # fmt: skip
PROSE_ANSWER = ("The three branches are the legislative, executive and judicial. The legislative makes "
                "laws.\n\nThe executive enforces them.")  # fmt: skip
SHORT_ANSWER = "The ice would cover most of the land, and the seas would be lower."


# -- reading the first line ----------------------------------------------------------------


@pytest.mark.parametrize(
    "text, kind, kept",
    [
        (INTRO_ANSWER, INTRO, "Learning Python offers several benefits, including:"),
        ("Here are some tips to help you：\n- Rest", INTRO, "Here are some tips to help you："),
        ("1. **Plan**: write it down.\n2. Rest", ITEM, ""),
        ("- Plan the day\n- Rest", ITEM, ""),
        (PROSE_ANSWER, PROSE, ""),
        ("\n\nSteps to follow:\n1. Go", INTRO, "\n\nSteps to follow:"),  # leading breaks open no line
        ("A heading: then prose that runs on.\nMore.", PROSE, ""),  # a colon inside the line is no intro
        ("## Benefits\n1. Speed", PROSE, ""),
    ],
    ids=["intro", "full-width-colon", "numbered-item", "bullet-item", "prose", "leading-breaks",
         "inner-colon", "heading"],  # fmt: skip
)
def test_the_first_line_decides(text, kind, kept):
    verdict = read_opening(text)
    assert verdict is not None and verdict.kind == kind
    assert text[: verdict.keep] == kept
    assert verdict.has_points == (kind != PROSE)


def test_no_verdict_while_the_first_line_is_open_then_prose_past_its_length():
    assert read_opening("Learning Python offers several") is None
    assert read_opening("\n\n") is None
    assert read_opening("x" * 40, max_chars=40) is None
    verdict = read_opening("x" * 41, max_chars=40)
    assert verdict.kind == PROSE and "40 characters" in verdict.reason
    # A line break past the limit is read the same way: the first line ran on.
    assert read_opening("x" * 41 + ":\n1. A", max_chars=40).kind == PROSE


def test_the_watch_reads_pieces_across_the_line_break_and_keeps_its_verdict():
    watch = OpeningWatch()
    pieces = ["Here are", " some tips", ":", "\n", "\n1.", " Rest"]
    verdicts = [watch.feed(p) for p in pieces]
    assert verdicts[:3] == [None, None, None]
    assert verdicts[3].kind == INTRO and verdicts[3].keep == len("Here are some tips:")
    assert all(v is verdicts[3] for v in verdicts[3:])  # decided once
    assert watch.end() is verdicts[3]


def test_an_answer_that_ends_within_its_first_line_is_prose():
    watch = OpeningWatch()
    assert watch.feed(SHORT_ANSWER) is None
    assert watch.end().kind == PROSE


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "400"])
def test_a_bad_length_is_refused(bad):
    with pytest.raises(ValueError, match="max_chars"):
        OpeningWatch(bad)
    with pytest.raises(ValueError, match="opening_chars"):
        SoTConfig(opening_chars=bad)


@pytest.mark.parametrize("bad", ["yes", 1, 0])
def test_read_opening_is_true_false_or_none(bad):
    with pytest.raises(ValueError, match="read_opening"):
        SoTConfig(read_opening=bad)


def test_by_default_only_mode_auto_reads_the_opening():
    assert SoTConfig().reads_opening("auto") and not SoTConfig().reads_opening("on")
    assert SoTConfig(read_opening=True).reads_opening("on")
    assert not SoTConfig(read_opening=False).reads_opening("auto")


# -- the runner ------------------------------------------------------------------------------


class WatchingBackend(FakeBackend):
    """A backend that, like the server's, ends a generation at a first line announcing a
    list (the intro kept, finish "opening"), and reports the tokens it decoded (words)."""

    watches_text = True

    def __init__(self, normal: str, *, fail_normal: bool = False, **kw) -> None:
        super().__init__(**kw)
        self.normal = normal
        self.fail_normal = fail_normal
        self.skeleton_cancelled = False

    async def generate(self, request, on_text=None):
        role = request.tag.role
        if role == PLAIN:
            self.requests.append(request)
            return await self._normal(request, on_text)
        if role == SKELETON:
            try:
                for _ in range(100):  # a long prefill: still running when the first line ends
                    await asyncio.sleep(0)
                return await super().generate(request, on_text)
            except asyncio.CancelledError:
                self.skeleton_cancelled = True
                raise
        return await super().generate(request, on_text)

    async def _normal(self, request, on_text):
        watch = OpeningWatch(request.read_opening) if request.read_opening else None
        text, words = "", self.normal.split(" ")
        for i, word in enumerate(words):
            piece = ("" if i == 0 else " ") + word
            text += piece
            if self.fail_normal and i == 2:
                raise RuntimeError("the scheduler ran out of memory")
            if on_text is not None:
                on_text(piece)
            verdict = watch.feed(piece) if watch else None
            if verdict is not None and verdict.has_points:
                return GenResult(text[: verdict.keep], len(request.prompt), i + 1, "opening")
            await asyncio.sleep(0)
        return GenResult(text, len(request.prompt), len(words), "stop")


def _run(backend, mode="on", **config):
    streamed = {ANSWER_CHANNEL: "", SKELETON_CHANNEL: ""}

    def sink(channel, text):
        streamed[channel] += text

    options = SoTOptions(mode=mode, config=SoTConfig(read_opening=True, **config))
    answer = asyncio.run(run_sot(QUESTION, backend, render, options, on_delta=sink))
    return answer, streamed


def test_prose_goes_on_as_the_normal_answer_and_the_skeleton_is_cancelled():
    fake = WatchingBackend(PROSE_ANSWER)
    answer, streamed = _run(fake)
    assert answer.path == NORMAL and answer.reason == "opening: the normal answer's first line is prose"
    assert answer.answer == PROSE_ANSWER and streamed[ANSWER_CHANNEL] == PROSE_ANSWER
    assert streamed[SKELETON_CHANNEL] == ""  # a plan never used is never streamed
    assert answer.skeleton is None and answer.branches is None and fake.skeleton_cancelled
    assert answer.opening.opening.kind == PROSE and answer.opening.result is None
    assert answer.completion_tokens == len(PROSE_ANSWER.split(" "))  # the normal answer's, once
    trace = answer.trace()
    assert trace["opening"]["kind"] == PROSE and not trace["fallback"]
    assert fake.of_role(PLAIN)[0].read_opening == SoTConfig().opening_chars


def test_a_short_answer_ending_in_its_first_line_is_the_answer():
    answer, streamed = _run(WatchingBackend(SHORT_ANSWER))
    assert answer.path == NORMAL and answer.answer == SHORT_ANSWER == streamed[ANSWER_CHANNEL]
    assert "ended within its first line" in answer.reason


def test_an_announced_list_is_answered_by_sot_under_its_intro():
    fake = WatchingBackend(INTRO_ANSWER)
    answer, streamed = _run(fake)
    intro = "Learning Python offers several benefits, including:"
    assert answer.path == SOT and answer.opening.opening.kind == INTRO
    assert answer.answer.startswith(intro + "\n\n1. ") and answer.answer == streamed[ANSWER_CHANNEL]
    assert answer.answer == answer.opening.lead + answer.merge.merged.text
    assert streamed[SKELETON_CHANNEL] == answer.skeleton.text  # released whole at the verdict
    # The intro's tokens (every word it decoded) are the answer's and come off the points' aim.
    intro_tokens = answer.opening.result.completion_tokens
    assert intro_tokens == len(intro.split(" "))  # its last word carries the line break
    assert answer.opening.result in answer.results
    assert answer.completion_tokens == sum(r.completion_tokens for r in answer.results)
    assert answer.opening.result.finish_reason == "opening" and answer.trace()["opening"]["text"] == intro


def test_the_points_aim_at_what_a_point_needs_after_an_intro_too():
    plain = asyncio.run(run_sot(QUESTION, FakeBackend(), render, SoTOptions(mode="on")))
    answer, _ = _run(WatchingBackend(INTRO_ANSWER))
    spent = answer.opening.result.completion_tokens
    skeleton = answer.skeleton.result.completion_tokens
    assert plain.skeleton.result.completion_tokens == skeleton
    points = len(answer.branches.plan.points)
    # Each point's aim is what a point needs, not a share of a total the intro would shrink.
    assert spent > 0 and points > 1
    assert plain.branches.plan.point_tokens == answer.branches.plan.point_tokens == POINT_AIM_TOKENS


def test_a_list_begun_at_once_keeps_no_intro():
    answer, streamed = _run(WatchingBackend("1. **Plan**: write the day down.\n2. Rest"))
    assert answer.path == SOT and answer.opening.opening.kind == ITEM and answer.opening.lead == ""
    assert answer.answer.startswith("1. ") and answer.answer == streamed[ANSWER_CHANNEL]


def test_a_skeleton_that_is_no_plan_after_an_intro_streams_no_intro():
    fake = WatchingBackend(INTRO_ANSWER, skeleton=" Just one point")
    answer, streamed = _run(fake)
    assert answer.path == NORMAL and answer.reason.startswith("skeleton direct")
    assert answer.answer == streamed[ANSWER_CHANNEL] == fake.normal  # the fallback's, from its start
    assert answer.opening.result is not None  # the intro's tokens were spent all the same
    assert answer.completion_tokens == sum(r.completion_tokens for r in answer.results)


def test_a_failed_normal_answer_fails_the_answer_and_cancels_the_skeleton():
    fake = WatchingBackend(INTRO_ANSWER, fail_normal=True)
    with pytest.raises(SoTPhaseError, match="normal answer"):
        _run(fake)
    assert fake.skeleton_cancelled


def test_mode_on_reads_no_opening_unless_asked():
    fake = WatchingBackend(PROSE_ANSWER)
    answer = asyncio.run(run_sot(QUESTION, fake, render, SoTOptions(mode="on")))
    assert answer.path == SOT and answer.opening is None and not fake.of_role(PLAIN)


def test_a_backend_that_cannot_watch_its_text_reads_no_opening():
    fake = FakeBackend()  # the frontend program's kind: no `watches_text`
    options = SoTOptions(mode="on", config=SoTConfig(read_opening=True))
    answer = asyncio.run(run_sot(QUESTION, fake, render, options))
    assert answer.path == SOT and answer.opening is None and not fake.of_role(PLAIN)
    assert len(fake.of_role(BRANCH)) == 3


def test_an_answer_that_runs_past_its_intro_keeps_the_intro_alone():
    # A backend that does not stop at the intro (or an answer that ends right after it): the
    # SoT answer still starts with the intro line only.
    class RunsOn(WatchingBackend):
        async def _normal(self, request, on_text):
            return await super()._normal(replace(request, read_opening=None), on_text)

    answer, streamed = _run(RunsOn(INTRO_ANSWER))
    assert answer.path == SOT and answer.opening.result.text == "Learning Python offers several benefits, including:"
    assert answer.answer == streamed[ANSWER_CHANNEL] == answer.opening.lead + answer.merge.merged.text
