"""The SoT orchestration without a server: a fake backend for the async runner, and a fake
HTTP layer for the frontend program (tags, fork/join, bounded branches)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time

import pytest

from sglang_specsot.sot import SoTConfig, merge_answer
from sglang_specsot.sot.merge import format_point
from sglang_specsot.sot.budget import POINT_AIM_TOKENS
from sglang_specsot.sot.prompts import POINT_LENGTH
from sglang_specsot.sot.router import quality_veto
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
    shared_prefix,
)

QUESTION = "How can I improve my time management skills?"
MATH = "Solve for x: 3x + 10 = 5x - 10."
SPIN_LIMIT = 100_000  # event-loop turns before a scenario counts as hung (no clock involved)


def render(messages: list[dict[str, str]]) -> str:
    return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<assistant>"


class FakeBackend:
    """Replies by role; branches can be held until released, or fail, or run to their budget."""

    def __init__(self, skeleton: str = " Plan the day\n2. Avoid distractions\n3. Take breaks",
                 *, gated: bool = False, fail_point: int | None = None,
                 endless: bool = False, context_chars: int | None = None) -> None:  # fmt: skip
        self.skeleton = skeleton
        self.gated = gated
        self.fail_point = fail_point
        self.endless = endless
        self.context_chars = context_chars
        self.requests = []
        self.running: set[int] = set()  # branch points generating now
        self.peak = 0
        self.cancelled: list[int] = []
        self.gates: dict[int, asyncio.Event] = {}

    def release(self, *points: int) -> None:
        for point in points:
            self.gates.setdefault(point, asyncio.Event()).set()

    async def generate(self, request, on_text=None):
        self.requests.append(request)
        if self.context_chars is not None and len(request.prompt) > self.context_chars:
            raise ValueError(f"input of {len(request.prompt)} characters is longer than the context")
        role, point = request.tag.role, request.tag.point
        if role != BRANCH:
            return await self._reply(self.skeleton if role == SKELETON else "A normal answer.",
                                     request, on_text)  # fmt: skip
        self.running.add(point)
        self.peak = max(self.peak, len(self.running))
        try:
            if self.gated:
                await self.gates.setdefault(point, asyncio.Event()).wait()
            if point == self.fail_point:
                raise RuntimeError(f"branch {point} broke")
            return await self._reply(f"Expansion of point {point + 1}.", request, on_text)
        except asyncio.CancelledError:
            self.cancelled.append(point)
            raise
        finally:
            self.running.discard(point)

    async def _reply(self, text, request, on_text):
        words = text.split(" ")
        finish = "stop"
        if self.endless and request.tag.role == BRANCH:
            words, finish = ["word"] * request.max_new_tokens, "length"  # runs to its budget
        elif request.max_new_tokens is not None and len(words) > request.max_new_tokens:
            words, finish = words[: request.max_new_tokens], "length"
        for i, word in enumerate(words):
            if on_text is not None:
                on_text(("" if i == 0 else " ") + word)
            await asyncio.sleep(0)
        return GenResult(" ".join(words), len(request.prompt), len(words), finish)

    def of_role(self, role):
        return [r for r in self.requests if r.tag.role == role]


def run(coro):
    return asyncio.run(coro)


async def spin_until(predicate, what: str) -> None:
    for _ in range(SPIN_LIMIT):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


def options(**config) -> SoTOptions:
    return SoTOptions(mode="on", config=SoTConfig(**config))


# -- the happy path ------------------------------------------------------------------------


def test_plan_gives_numbered_answer_in_skeleton_order_with_tags():
    fake = FakeBackend()
    answer = run(run_sot(QUESTION, fake, render, options()))
    assert answer.path == SOT
    assert answer.answer.split("\n") == [
        "1. **Plan the day**: Expansion of point 1.",
        "2. **Avoid distractions**: Expansion of point 2.",
        "3. **Take breaks**: Expansion of point 3.",
    ]
    # Each branch's assistant turn is pre-filled with its point's bold title and a colon.
    prefills = {r.tag.point: r.prefill for r in fake.of_role(BRANCH)}
    assert prefills == {0: "**Plan the day**:", 1: "**Avoid distractions**:", 2: "**Take breaks**:"}
    assert all(r.prompt.endswith("<assistant>" + r.prefill) for r in fake.of_role(BRANCH))
    assert answer.skeleton.text == "1. Plan the day\n2. Avoid distractions\n3. Take breaks"
    groups = {r.tag.group for r in fake.requests}
    assert groups == {answer.group}
    branch_tags = sorted((r.tag.to_custom_params()["specsot"] for r in fake.of_role(BRANCH)),
                         key=lambda t: t["point"])  # fmt: skip
    assert branch_tags == [{"group": answer.group, "role": "branch", "point": i, "n": 3} for i in range(3)]
    assert fake.of_role(SKELETON)[0].tag.to_custom_params() == {"specsot": {"group": answer.group, "role": "skeleton"}}
    # Only branches end early on a loop: a skeleton has its format, a normal answer is SGLang's.
    assert {r.tag.role: r.stop_on_loop for r in fake.requests} == {SKELETON: False, BRANCH: True}
    # Usage counts every generation, prompts included.
    assert answer.completion_tokens == sum(r.completion_tokens for r in answer.results)
    assert len(answer.results) == 4
    assert answer.prompt_tokens == sum(len(r.prompt) for r in fake.requests)
    trace = json.loads(json.dumps(answer.trace()))
    assert trace["skeleton"]["points"] == ["Plan the day", "Avoid distractions", "Take breaks"]
    assert [b["text"] for b in trace["branches"]["items"]] == [f"Expansion of point {i}." for i in (1, 2, 3)]
    assert [b["ended"] for b in trace["branches"]["items"]] == ["stop"] * 3
    assert trace["fallback"] is False and trace["skeleton"]["ended"] == "stop"
    assert trace["skeleton"]["constrained"] is False  # options() sends no processor


def test_branch_prompts_share_a_prefix_and_see_the_whole_skeleton():
    fake = FakeBackend()
    run(run_sot(QUESTION, fake, render, options()))
    prompts = [r.prompt for r in sorted(fake.of_role(BRANCH), key=lambda r: r.tag.point)]
    common = shared_prefix(prompts)
    assert "1. Plan the day\n2. Avoid distractions\n3. Take breaks" in common
    assert common.endswith("\n")  # cut at a line break: it tokenizes alike alone and inside a prompt
    assert all(p.startswith(common) for p in prompts)
    assert all(f'point {i}' in p[len(common) :] for i, p in enumerate(prompts, 1))


def test_stream_skeleton_first_then_points_in_skeleton_order_whatever_finishes_first():
    fake = FakeBackend(gated=True)
    pieces: list[tuple[str, str]] = []

    async def scenario():
        task = asyncio.create_task(
            run_sot(QUESTION, fake, render, options(max_running=3), on_delta=lambda c, t: pieces.append((c, t)))
        )
        await spin_until(lambda: len(fake.running) == 3, "three branches running")
        fake.release(2)
        await spin_until(lambda: 2 not in fake.running, "point 3 finished")
        assert [c for c, _ in pieces if c == ANSWER_CHANNEL] == []  # point 3 waits for 1 and 2
        fake.release(0)
        await spin_until(lambda: any(c == ANSWER_CHANNEL for c, _ in pieces), "point 1 released")
        assert "".join(t for c, t in pieces if c == ANSWER_CHANNEL).count("\n") == 0
        fake.release(1)
        return await asyncio.wait_for(task, 60)  # hang guard

    answer = run(scenario())
    channels = [c for c, _ in pieces]
    assert channels == sorted(channels, key=[SKELETON_CHANNEL, ANSWER_CHANNEL].index)
    assert "".join(t for c, t in pieces if c == SKELETON_CHANNEL) == answer.skeleton.text
    assert "".join(t for c, t in pieces if c == ANSWER_CHANNEL) == answer.answer
    answer_pieces = [t for c, t in pieces if c == ANSWER_CHANNEL]
    assert answer_pieces[0].startswith("1. ") and answer_pieces[1].startswith("\n2. ")
    assert answer_pieces[2].startswith("\n3. ")
    assert answer.branches.start_order == (0, 1, 2)


def test_at_most_max_running_branches_and_waiting_ones_start_as_others_finish():
    skeleton = " One\n2. Two\n3. Three\n4. Four\n5. Five"
    fake = FakeBackend(skeleton, gated=True)

    async def scenario():
        task = asyncio.create_task(run_sot(QUESTION, fake, render, options(max_running=2)))
        await spin_until(lambda: len(fake.running) == 2, "two branches running")
        for _ in range(100):  # nothing else starts while both slots are busy
            await asyncio.sleep(0)
        assert fake.running == {0, 1}
        fake.release(1)
        await spin_until(lambda: fake.running == {0, 2}, "branch 3 took the free slot")
        fake.release(0, 2, 3, 4)
        return await asyncio.wait_for(task, 60)

    answer = run(scenario())
    assert fake.peak == 2 and answer.branches.peak_running == 2
    assert answer.branches.start_order == (0, 1, 2, 3, 4)
    assert len(answer.answer.split("\n")) == 5


def test_longest_predicted_branch_starts_first():
    fake = FakeBackend(" Intro(40): x\n2. Core(300): y\n3. End(120): z")
    answer = run(run_sot(QUESTION, fake, render, options(max_running=1, predicted_length_slack=1.0)))
    assert answer.branches.start_order == (1, 2, 0)
    assert {r.tag.point: r.max_new_tokens for r in fake.of_role(BRANCH)} == {0: 40, 1: 300, 2: 120}
    assert answer.answer.startswith("1. **Intro**: ")  # merged in skeleton order all the same


# -- routing and normal answers ---------------------------------------------------------------


def test_auto_routes_math_to_a_normal_answer_without_a_skeleton():
    fake = FakeBackend()
    answer = run(run_sot(MATH, fake, render, SoTOptions(mode="auto")))
    assert answer.path == NORMAL and answer.route.decision.rule == "math"
    assert [r.tag.role for r in fake.requests] == [PLAIN]
    assert fake.requests[0].prompt == render([{"role": "user", "content": MATH}])
    assert answer.answer == "A normal answer." and answer.skeleton is None


def test_auto_sends_a_list_question_to_sot_and_off_never_does():
    assert run(run_sot(QUESTION, FakeBackend(), render, SoTOptions(mode="auto"))).path == SOT
    assert run(run_sot(QUESTION, FakeBackend(), render, SoTOptions(mode="off"))).path == NORMAL


SYSTEM = "You are a pirate. Talk like one."


def test_the_clients_system_prompt_reaches_the_skeleton_every_branch_and_a_normal_answer():
    fake = FakeBackend()
    answer = run(run_sot(QUESTION, fake, render, SoTOptions(mode="auto", system_prompt=SYSTEM)))
    assert answer.path == SOT
    prompts = [r.prompt for r in fake.of_role(SKELETON) + fake.of_role(BRANCH)]
    assert len(prompts) == 4 and all(SYSTEM in p for p in prompts)
    shared = shared_prefix(r.prompt for r in fake.of_role(BRANCH))  # each branch adds only its point's line
    assert all(SYSTEM not in r.prompt.removeprefix(shared) for r in fake.of_role(BRANCH)) and SYSTEM in shared
    fake = FakeBackend("no plan here")  # a skeleton that is no plan: the normal answer, same system turn
    answer = run(run_sot(QUESTION, fake, render, SoTOptions(mode="on", system_prompt=SYSTEM)))
    assert answer.path == NORMAL
    assert fake.of_role(PLAIN)[0].prompt == render([{"role": "system", "content": SYSTEM},
                                                    {"role": "user", "content": QUESTION}])  # fmt: skip


def test_a_system_prompt_that_trips_a_hard_rule_keeps_auto_normal_but_not_on():
    json_system = "Reply in JSON."
    fake = FakeBackend()
    answer = run(run_sot(QUESTION, fake, render, SoTOptions(mode="auto", system_prompt=json_system)))
    assert answer.path == NORMAL and answer.route.decision.rule == "system_structured"
    assert [r.tag.role for r in fake.requests] == [PLAIN]
    forced = run(run_sot(QUESTION, FakeBackend(), render, SoTOptions(mode="on", system_prompt=json_system)))
    assert forced.path == SOT and forced.route.decision.rule == "mode_on"
    # The question's own hard rules still come first.
    math = run(run_sot(MATH, FakeBackend(), render, SoTOptions(mode="auto", system_prompt=SYSTEM)))
    assert math.route.decision.rule == "math"


@pytest.mark.parametrize("question", [
    "How would the world be different if humans could breathe underwater?",
    "Imagine a planet where it is always daytime. What would its cities be like?",
    "What if the internet had never been invented?",
])  # fmt: skip
def test_a_changed_premise_is_answered_normally_in_auto_but_not_on(question):
    fake = FakeBackend()
    answer = run(run_sot(question, fake, render, SoTOptions(mode="auto")))
    assert answer.path == NORMAL and answer.route.decision.rule == "counterfactual"
    assert [r.tag.role for r in fake.requests] == [PLAIN]  # no classifier, no skeleton
    assert run(run_sot(question, FakeBackend(), render, SoTOptions(mode="on"))).path == SOT


def test_the_quality_veto_leaves_a_factual_change_question_and_a_persona_alone():
    assert quality_veto("How has the smartphone changed everyday life?") is None
    assert quality_veto("What are good ways to reduce screen time?") is None
    # A persona in the system prompt is no changed premise of the question.
    answer = run(run_sot(QUESTION, FakeBackend(), render,
                         SoTOptions(mode="auto", system_prompt="Imagine you are a pirate.")))  # fmt: skip
    assert answer.route.decision.rule != "counterfactual"


def test_a_cap_too_small_for_sot_answers_normally_within_it_even_in_mode_on():
    assert run(run_sot(QUESTION, FakeBackend(), render, SoTOptions(max_new_tokens=50))).path == NORMAL
    fake = FakeBackend(endless=True)
    answer = run(run_sot(QUESTION, fake, render, SoTOptions(mode="on", max_new_tokens=16)))
    assert answer.path == NORMAL and answer.route.decision.rule == "cap_too_small"
    assert [(r.tag.role, r.max_new_tokens) for r in fake.requests] == [(PLAIN, 16)]


@pytest.mark.parametrize("cap", [80, 100, 200, 400, 1000])
def test_the_cap_bounds_the_whole_answer_not_each_generation(cap):
    skeleton = " Point 1\n" + "\n".join(f"{i}. Point {i}" for i in range(2, 11))
    fake = FakeBackend(skeleton, endless=True)  # every branch runs to its budget
    answer = run(run_sot(QUESTION, fake, render, SoTOptions(mode="on", max_new_tokens=cap)))
    assert answer.completion_tokens <= cap
    # What the skeleton used plus what every later generation may use: the branches get the
    # skeleton's unused budget, never more.
    later = sum(r.max_new_tokens for r in fake.requests if r.tag.role != SKELETON)
    assert answer.skeleton.result.completion_tokens + later <= cap
    # Below 200 the skeleton itself is cut short, so a normal answer may follow it.
    assert answer.path == SOT or cap < 200


def test_a_cap_drops_later_points_before_starving_every_branch():
    skeleton = " Point 1\n" + "\n".join(f"{i}. Point {i}" for i in range(2, 11))
    fake = FakeBackend(skeleton, endless=True)
    answer = run(run_sot(QUESTION, fake, render, SoTOptions(mode="on", max_new_tokens=200)))
    # 200 - the skeleton's 21 words leave 179: five branches of at least min_branch_tokens (32),
    # which share the 179 as 35 each, below the budget each point's aim would get.
    assert answer.skeleton.result.completion_tokens == 21
    assert answer.branches.plan.points == ("Point 1", "Point 2", "Point 3", "Point 4", "Point 5")
    assert answer.branches.plan.dropped_points[:2] == ("Point 6", "Point 7")
    assert answer.branches.plan.point_tokens == POINT_AIM_TOKENS
    assert {r.max_new_tokens for r in fake.of_role(BRANCH)} == {35}
    assert {r.end_after for r in fake.of_role(BRANCH)} == {35}  # the aim, within the budget


@pytest.mark.parametrize("cap", [None, 300])
def test_every_point_aims_at_what_a_point_needs_whatever_the_skeletons_length(cap):
    fake = FakeBackend()
    answer = run(run_sot(QUESTION, fake, render, SoTOptions(mode="on", max_new_tokens=cap)))
    plan, skeleton = answer.branches.plan, answer.skeleton.result.completion_tokens
    assert plan.point_tokens == POINT_AIM_TOKENS  # not a share of a total
    budgets = [r.max_new_tokens for r in fake.of_role(BRANCH)]
    if cap is None:  # headroom over the aim, so a branch ends its own last sentence
        assert set(budgets) == {round(POINT_AIM_TOKENS * SoTConfig().predicted_length_slack)}
    else:  # the cap first
        assert skeleton + sum(budgets) <= cap
    assert all(f"{POINT_LENGTH} of prose" in r.prompt for r in fake.of_role(BRANCH))
    assert {r.end_after for r in fake.of_role(BRANCH)} == {min(POINT_AIM_TOKENS, *budgets)}


class OvershootingSkeleton(FakeBackend):
    """A skeleton that reports more tokens than its budget, as a speculative step may."""

    async def generate(self, request, on_text=None):
        result = await super().generate(request, on_text)
        if request.tag.role != SKELETON:
            return result
        return GenResult(result.text, result.prompt_tokens, request.max_new_tokens + 10, result.finish_reason)


def test_a_skeleton_that_leaves_too_little_answers_normally_within_the_rest():
    fake = OvershootingSkeleton(endless=True)
    answer = run(run_sot(QUESTION, fake, render, SoTOptions(mode="on", max_new_tokens=100)))
    # The skeleton may use 100 - 2 * 32 = 36 tokens; it reported 46, leaving 54 < 2 * 32.
    assert answer.skeleton.request.max_new_tokens == 36
    assert answer.path == NORMAL and "cannot hold 2 branches" in answer.reason
    assert [r.max_new_tokens for r in fake.of_role(PLAIN)] == [54]
    assert answer.completion_tokens <= 100


@pytest.mark.parametrize(
    "skeleton, outcome",
    [("", "error"), ("   \n  ", "error"), (" Just one point", "direct"), ("!!! ??? ###", "error")],
    ids=["no-skeleton", "blank", "one-point", "symbols"],
)
def test_unusable_skeleton_falls_back_to_a_normal_answer_and_counts_the_skeleton(skeleton, outcome):
    fake = FakeBackend(skeleton)
    answer = run(run_sot(QUESTION, fake, render, options()))
    assert answer.path == NORMAL and answer.skeleton.parse.outcome == outcome
    assert answer.reason.startswith(f"skeleton {outcome}")
    assert [r.tag.role for r in fake.requests] == [SKELETON, PLAIN]
    assert answer.completion_tokens == answer.skeleton.result.completion_tokens + answer.normal.result.completion_tokens
    assert answer.trace()["fallback"] is True


def test_a_skeleton_cut_by_its_cap_falls_back_instead_of_answering_in_part():
    fake = FakeBackend(" Bubble sort basics\n2. Quick sort pivots\n3. Merge sort halves\n4. Heap")
    answer = run(run_sot(QUESTION, fake, render, options(skeleton_max_tokens=9)))
    assert answer.skeleton.result.finish_reason == "length"
    assert answer.path == NORMAL and "token cap" in answer.reason
    assert answer.trace()["fallback"] is True and answer.trace()["skeleton"]["ended"] == "budget"


def test_sixty_points_are_capped_to_max_points():
    skeleton = " Point 1\n" + "\n".join(f"{i}. Point {i}" for i in range(2, 61))
    fake = FakeBackend(skeleton)
    answer = run(run_sot(QUESTION, fake, render, options(max_points=10)))
    assert len(fake.of_role(BRANCH)) == 10
    assert any("kept the first 10 of 60" in note for note in answer.skeleton.parse.notes)
    assert [line.split(".")[0] for line in answer.answer.split("\n")] == [str(i) for i in range(1, 11)]


def test_empty_and_duplicate_points_are_dropped():
    fake = FakeBackend(" Sleep well\n2.\n3. Sleep well\n4. Eat well\n5. -")
    answer = run(run_sot(QUESTION, fake, render, options()))
    assert answer.branches.plan.points == ("Sleep well", "Eat well")
    assert {r.tag.n for r in fake.of_role(BRANCH)} == {2}


def test_a_branch_that_never_ends_stops_at_its_budget():
    fake = FakeBackend(endless=True)
    answer = run(run_sot(QUESTION, fake, render, options(max_branch_tokens=48, default_branch_tokens=48, min_branch_tokens=16)))
    assert {r.max_new_tokens for r in fake.of_role(BRANCH)} == {48}  # the aim's budget, capped at 48
    assert {b.result.completion_tokens for b in answer.branches.results} == {48}
    assert answer.finish_reason == "length"
    assert run(run_sot(QUESTION, FakeBackend(), render, options())).finish_reason == "stop"


# -- errors ------------------------------------------------------------------------------------


def test_question_longer_than_the_context_is_a_clear_error_before_any_branch():
    fake = FakeBackend(context_chars=2_000)
    with pytest.raises(SoTPhaseError) as info:
        run(run_sot("why? " * 1_000, fake, render, options()))
    assert info.value.phase == "skeleton" and isinstance(info.value.cause, ValueError)
    assert "longer than the context" in str(info.value)
    assert fake.of_role(BRANCH) == []


def test_a_failing_branch_cancels_the_running_ones_and_starts_no_more():
    fake = FakeBackend(" One\n2. Two\n3. Three\n4. Four", gated=True, fail_point=1)

    async def scenario():
        task = asyncio.create_task(run_sot(QUESTION, fake, render, options(max_running=2)))
        await spin_until(lambda: fake.running == {0, 1}, "two branches running")
        fake.release(1)
        with pytest.raises(SoTPhaseError) as info:
            await asyncio.wait_for(task, 60)
        return info.value

    error = run(scenario())
    assert error.phase == "branch 2" and "branch 1 broke" in str(error)
    assert fake.cancelled == [0] and fake.running == set()
    assert sorted(r.tag.point for r in fake.of_role(BRANCH)) == [0, 1]


def test_cancelling_the_answer_mid_branch_leaves_no_branch_running():
    fake = FakeBackend(" One\n2. Two\n3. Three", gated=True)

    async def scenario():
        task = asyncio.create_task(run_sot(QUESTION, fake, render, options(max_running=2)))
        await spin_until(lambda: len(fake.running) == 2, "two branches running")
        task.cancel()  # what a client disconnect does to the server's handler
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())
    assert sorted(fake.cancelled) == [0, 1] and fake.running == set()
    assert sorted(r.tag.point for r in fake.of_role(BRANCH)) == [0, 1]  # point 3 never started


@pytest.mark.parametrize(
    "kwargs",
    [{"mode": "sometimes"}, {"max_new_tokens": 0}, {"max_new_tokens": True},
     {"skeleton_logit_processor": ""}, {"config": {"max_points": 3}},
     {"system_prompt": ""}, {"system_prompt": "  "}, {"system_prompt": 3}],  # fmt: skip
)
def test_bad_options_are_value_errors(kwargs):
    with pytest.raises(ValueError):
        SoTOptions(**kwargs)


# -- pure helpers --------------------------------------------------------------------------


def test_format_point_pieces_join_to_the_merged_text():
    points = ["Sleep", "Diet: eat well", "Move"]
    expansions = {0: "1. Sleep\nGo to bed early.", 1: "Eat greens. 3. Move more", 2: ""}
    merged = merge_answer(points, expansions)
    assert "\n".join(format_point(p) for p in merged.points) == merged.text


def test_shared_prefix_ends_at_the_last_common_line_break():
    assert shared_prefix(["a\nbc\ncX", "a\nbc\ncY", "a\nbc\nZ"]) == "a\nbc\n"
    assert shared_prefix(["a\nbX", "a\nbY"]) == "a\n"
    assert shared_prefix(["abcX", "abcY"]) == ""  # no common line: nothing worth committing
    assert shared_prefix(["same\n"]) == "same\n" and shared_prefix([]) == ""


# -- the frontend program over a fake HTTP server ------------------------------------------------


class FakeHTTP:
    """Stands in for sglang's `http_request`: a /generate server answering by prompt text."""

    def __init__(self, skeleton: str) -> None:
        self.skeleton = skeleton
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.finished = 0
        self.release = threading.Semaphore(0)
        self.failing_point: int | None = None  # this branch's request gets an HTTP 500
        self.first_replies: dict[int, str] = {}  # point -> its branch's first reply, if not the usual

    def __call__(self, url, json=None, **kwargs):
        if url.endswith("/get_model_info"):
            return _Response({"model_path": "fake-model"})
        body = json
        with self.lock:
            self.bodies.append(body)
        params = body["sampling_params"]
        if params["max_new_tokens"] == 0:  # the fork's prefix commit
            return _Response({"text": "", "meta_info": _meta(body, 0)})
        role = params.get("custom_params", {}).get("specsot", {}).get("role")
        if role == "branch" and params["custom_params"]["specsot"]["point"] == self.failing_point:
            return _Response({"error": "boom"}, status_code=500)
        if role == "branch":
            with self.lock:
                self.running += 1
                self.peak = max(self.peak, self.running)
            self.release.acquire(timeout=60)  # hang guard; the test releases branches
            with self.lock:
                self.running -= 1
                self.finished += 1
            point = params["custom_params"]["specsot"]["point"]
            with self.lock:
                reply = self.first_replies.pop(point, f"Expansion {point + 1}.")
            return _Response({"text": reply, "meta_info": _meta(body, 2)})
        text = self.skeleton if role == "skeleton" else "Normal answer."
        return _Response({"text": text, "meta_info": _meta(body, len(text.split()))})


class _Response:
    def __init__(self, payload: dict, status_code: int = 200) -> None:
        self.payload = payload
        self.status_code = status_code

    def json(self) -> dict:
        return self.payload


def _meta(body: dict, completion: int) -> dict:
    return {"prompt_tokens": len(body["text"]), "completion_tokens": completion,
            "finish_reason": {"type": "stop"}}  # fmt: skip


@pytest.fixture
def fake_http(monkeypatch):
    import sglang.lang.backend.runtime_endpoint as runtime_endpoint

    fake = FakeHTTP(" Plan the day\n2. Avoid distractions\n3. Take breaks\n4. Sleep")
    monkeypatch.setattr(runtime_endpoint, "http_request", fake)
    return fake


def _wait(predicate) -> None:
    for _ in range(SPIN_LIMIT):  # hang guard by count; assertions below catch what went wrong
        if predicate():
            return
        time.sleep(0.001)


def _release_branches(fake: FakeHTTP, total: int, slots: int) -> threading.Thread:
    """Release branches one at a time, each only once every free slot has been filled."""

    def run() -> None:
        for k in range(total):
            _wait(lambda: fake.running == min(slots, total - k))
            fake.release.release()
            _wait(lambda: fake.finished == k + 1)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_frontend_program_tags_every_generation_and_bounds_branches(fake_http):
    from sglang_specsot.frontend import SoTEndpoint, answer_question

    endpoint = SoTEndpoint("http://fake")
    releaser = _release_branches(fake_http, total=4, slots=2)
    config = SoTConfig(max_running=2, skeleton_max_tokens=30)
    answer = answer_question(endpoint, QUESTION, render,
                             SoTOptions(mode="on", config=config, skeleton_logit_processor="PROCESSOR"))  # fmt: skip
    releaser.join(timeout=60)
    assert answer.path == SOT
    assert answer.answer.split("\n")[0] == "1. **Plan the day**: Expansion 1."
    gens = [b for b in fake_http.bodies if b["sampling_params"]["max_new_tokens"] > 0]
    tags = [b["sampling_params"]["custom_params"]["specsot"] for b in gens]
    assert tags[0] == {"group": answer.group, "role": "skeleton"}
    assert sorted(t["point"] for t in tags[1:]) == [0, 1, 2, 3]
    assert {(t["role"], t["n"], t["group"]) for t in tags[1:]} == {("branch", 4, answer.group)}
    assert gens[0]["custom_logit_processor"] == "PROCESSOR"
    assert all("custom_logit_processor" not in b for b in gens[1:])
    assert gens[0]["sampling_params"]["max_new_tokens"] == 30
    # The fork committed the branches' shared prefix once, untagged, before any branch ran.
    commits = [b for b in fake_http.bodies if b["sampling_params"]["max_new_tokens"] == 0]
    assert len(commits) == 1 and "custom_params" not in commits[0]["sampling_params"]
    assert all(b["text"].startswith(commits[0]["text"]) for b in gens[1:])
    assert fake_http.peak == 2


def test_frontend_program_answers_math_normally(fake_http):
    from sglang_specsot.frontend import SoTEndpoint, answer_question

    answer = answer_question(SoTEndpoint("http://fake"), MATH, render, SoTOptions(max_new_tokens=64))
    assert answer.path == NORMAL and answer.answer == "Normal answer."
    (body,) = fake_http.bodies
    assert body["text"] == render([{"role": "user", "content": MATH}])
    assert body["sampling_params"]["custom_params"]["specsot"]["role"] == "plain"
    assert body["sampling_params"]["max_new_tokens"] == 64


def test_frontend_program_reports_a_failed_branch_by_its_phase(fake_http):
    from sglang_specsot.frontend import SoTEndpoint, answer_question

    fake_http.failing_point = 1
    for _ in range(4):
        fake_http.release.release()  # the other branches answer at once
    with pytest.raises(SoTPhaseError, match="SoT branch 2 failed: .*boom"):
        answer_question(SoTEndpoint("http://fake"), QUESTION, render, SoTOptions(mode="on"), constrain_skeleton=False)


def test_items_the_question_names_become_branches_when_the_skeleton_misses_them():
    question = "Compare the sorting algorithms bubble sort, quick sort, merge sort and heap sort."
    fake = FakeBackend(" Bubble sort\n2. Quick sort")
    answer = run(run_sot(question, fake, render, options(derive_skeleton=False)))
    assert answer.path == SOT
    assert answer.branches.plan.points == ("Bubble sort", "Quick sort", "merge sort", "heap sort")
    assert "added points the question names" in " ".join(answer.trace()["skeleton"]["notes"])


NAMED = "Compare the sorting algorithms bubble sort, quick sort, merge sort and heap sort."


def test_a_question_that_names_its_items_is_planned_by_them_without_a_skeleton():
    fake, deltas = FakeBackend(" Speed\n2. Memory"), []
    answer = run(run_sot(NAMED, fake, render, options(), on_delta=lambda c, t: deltas.append((c, t))))
    assert answer.path == SOT and fake.of_role(SKELETON) == []
    assert answer.branches.plan.points == ("Bubble sort", "Quick sort", "Merge sort", "Heap sort")
    assert answer.answer.split("\n")[0] == "1. **Bubble sort**: Expansion of point 1."
    skeleton = answer.trace()["skeleton"]
    assert skeleton["derived"] and skeleton["outcome"] == "plan" and not skeleton["constrained"]
    assert skeleton["completion_tokens"] == 0 and skeleton["seconds"] == 0.0
    assert "no skeleton was generated" in " ".join(skeleton["notes"])
    # clients still see the plan, on the skeleton channel, as the skeleton's text
    streamed = "".join(t for c, t in deltas if c == SKELETON_CHANNEL)
    assert streamed == skeleton["text"] == "1. Bubble sort\n2. Quick sort\n3. Merge sort\n4. Heap sort"
    # the whole cap is left for the branches
    assert answer.completion_tokens == sum(b.result.completion_tokens for b in answer.branches.results)


@pytest.mark.parametrize("config", [{"derive_skeleton": False}, {"max_points": 3}])
def test_the_skeleton_is_generated_when_deriving_is_off_or_the_items_do_not_fit(config):
    fake = FakeBackend(" Speed\n2. Memory")
    answer = run(run_sot(NAMED, fake, render, options(**config)))
    assert len(fake.of_role(SKELETON)) == 1 and not answer.trace()["skeleton"]["derived"]


def test_a_question_without_a_series_of_items_generates_its_skeleton():
    fake = FakeBackend()
    run(run_sot(QUESTION, fake, render, options()))
    assert len(fake.of_role(SKELETON)) == 1


def test_a_branch_cut_by_its_budget_drops_its_unfinished_sentence_but_the_trace_keeps_it():
    class Cut(FakeBackend):
        async def _reply(self, text, request, on_text):
            if request.tag.role == BRANCH:
                return GenResult(f"Point {request.tag.point + 1} matters. It also", 1, 8, "length")
            return await super()._reply(text, request, on_text)

    answer = run(run_sot(QUESTION, Cut(), render, options()))
    assert answer.answer.split("\n")[0] == "1. **Plan the day**: Point 1 matters."
    assert answer.trace()["branches"]["items"][0]["text"].endswith("It also")
    assert answer.trace()["branches"]["items"][0]["ended"] == "budget"


def test_the_answers_accept_length_pools_the_speculated_generations():
    class Speculating(FakeBackend):
        async def _reply(self, text, request, on_text):
            result = await super()._reply(text, request, on_text)
            # The skeleton was not speculated (0 verify steps); each branch took 2 verify forwards.
            steps = 2 if request.tag.role == BRANCH else 0
            return GenResult(result.text, result.prompt_tokens, result.completion_tokens, result.finish_reason, steps)

    answer = run(run_sot(QUESTION, Speculating(), render, options()))
    branches = [b.result for b in answer.branches.results]
    assert answer.accept_length == sum(r.completion_tokens for r in branches) / (2 * len(branches))
    trace = answer.trace()
    assert trace["spec_accept_length"] == answer.accept_length
    assert [b["spec_verify_ct"] for b in trace["branches"]["items"]] == [2, 2, 2]
    assert trace["skeleton"]["spec_verify_ct"] == 0
    # A server that does not speculate: no accept length, not a division by zero.
    assert run(run_sot(QUESTION, FakeBackend(), render, options())).trace()["spec_accept_length"] is None


class EmptyAfterLeadIn(FakeBackend):
    """Point 2's branch first writes nothing after its pre-filled lead-in ("**Avoid
    distractions**:") and stops, as a small model may; `again` is what it writes when asked once
    more (with nothing pre-filled)."""

    def __init__(self, again: str = "Avoid distractions: Silence the phone and close the mail.",
                 finish: str = "stop") -> None:  # fmt: skip
        super().__init__()
        self.again, self.finish = again, finish

    async def _reply(self, text, request, on_text):
        if request.tag.role == BRANCH and request.tag.point == 1:
            asked = len([r for r in self.of_role(BRANCH) if r.tag.point == 1])
            reply = "" if asked == 1 else self.again
            return GenResult(reply, len(request.prompt), 4, self.finish if asked == 1 else "stop")
        return await super()._reply(text, request, on_text)


def test_a_branch_that_writes_nothing_after_its_lead_in_is_asked_once_more_with_nothing_pre_filled():
    fake = EmptyAfterLeadIn()
    answer = run(run_sot(QUESTION, fake, render, options(max_branch_tokens=40, default_branch_tokens=40)))
    # The second answer echoed its title (nothing led it in): the merge strips the echo.
    assert answer.answer.split("\n")[1] == "2. **Avoid distractions**: Silence the phone and close the mail."
    first, second = [r for r in fake.of_role(BRANCH) if r.tag.point == 1]
    assert first.prefill == "**Avoid distractions**:"
    assert second.tag == first.tag and second.prefill == ""
    assert first.prompt == second.prompt + "**Avoid distractions**:"  # the same prompt, nothing led in
    assert second.max_new_tokens == first.max_new_tokens - 4  # what the first try left of the budget
    assert len(fake.of_role(BRANCH)) == 4  # one branch asked twice, the others once
    # The first try counts in the answer's usage, and the trace keeps it.
    assert len(answer.results) == 5 and answer.completion_tokens == sum(r.completion_tokens for r in answer.results)
    item = answer.trace()["branches"]["items"][1]
    assert item["first_try"]["text"] == "" and item["first_try"]["ended"] == "stop"
    assert item["text"] == "Avoid distractions: Silence the phone and close the mail." and item["max_new_tokens"] == 36
    assert answer.trace()["merge"]["empty_points"] == []


@pytest.mark.parametrize("kwargs, config", [
    ({"again": " Avoid distractions."}, {}),  # empty again: asked twice at most
    ({"again": ""}, {}),
    ({"finish": "length"}, {}),  # cut by its budget: nothing is left to ask with
    ({}, {"retry_empty_points": False}),
    ({}, {"max_branch_tokens": 19, "default_branch_tokens": 19, "min_branch_tokens": 8}),  # 15 left: too few
])  # fmt: skip
def test_a_branch_empty_after_its_lead_in_keeps_its_bare_title_when_asking_again_cannot_help(kwargs, config):
    fake = EmptyAfterLeadIn(**kwargs)
    answer = run(run_sot(QUESTION, fake, render, options(**config)))
    asked = [r for r in fake.of_role(BRANCH) if r.tag.point == 1]
    assert len(asked) == (2 if "again" in kwargs else 1)
    assert [r.prefill for r in asked] == ["**Avoid distractions**:", ""][: len(asked)]
    assert answer.answer.split("\n")[1] == "2. **Avoid distractions**"
    assert answer.trace()["merge"]["empty_points"] == [1]


def test_only_a_branch_that_had_a_lead_in_is_asked_again():
    from sglang_specsot.sot.gen_requests import retry_request

    fake = FakeBackend()
    opts = options(max_branch_tokens=40, default_branch_tokens=40)
    answer = run(run_sot(QUESTION, fake, render, opts))
    first = next(r for r in fake.of_role(BRANCH) if r.tag.point == 1)
    empty = GenResult("", len(first.prompt), 4, "stop")
    again = retry_request(QUESTION, answer.branches.plan, render, opts, first, empty)
    assert again is not None and again.prefill == "" and first.prompt == again.prompt + first.prefill
    # A request with nothing pre-filled (a retry, or any bare first ask) is not asked again.
    assert retry_request(QUESTION, answer.branches.plan, render, opts, again, empty) is None
    bare = dataclasses.replace(first, prompt=again.prompt, prefill="")
    assert retry_request(QUESTION, answer.branches.plan, render, opts, bare, empty) is None
    # A branch that wrote content after its lead-in stands.
    written = GenResult(" Silence the phone.", len(first.prompt), 4, "stop")
    assert retry_request(QUESTION, answer.branches.plan, render, opts, first, written) is None


def test_the_frontend_program_asks_a_branch_empty_after_its_lead_in_again_in_a_fork_of_its_own(fake_http):
    from sglang_specsot.frontend import SoTEndpoint, answer_question

    fake_http.release = threading.Semaphore(100)  # branches run without being held
    fake_http.first_replies = {1: ""}  # nothing after the lead-in
    answer = answer_question(SoTEndpoint("http://fake"), QUESTION, render, options(skeleton_max_tokens=30),
                             constrain_skeleton=False)
    assert answer.answer.split("\n")[1] == "2. **Avoid distractions**: Expansion 2."
    tags = [(b, b["sampling_params"].get("custom_params", {}).get("specsot", {})) for b in fake_http.bodies]
    branches = [b for b, tag in tags if tag.get("role") == "branch"]
    again = [b for b, tag in tags if tag.get("role") == "branch" and tag["point"] == 1]
    assert len(branches) == 5 and len(again) == 2
    # The second ask is the first's prompt without its lead-in, after the one committed prefix.
    commits = [b for b in fake_http.bodies if b["sampling_params"]["max_new_tokens"] == 0]
    assert len(commits) == 1 and again[1]["text"].startswith(commits[0]["text"])
    assert again[0]["text"] == again[1]["text"] + "**Avoid distractions**:"
    assert answer.branches.results[1].first_try.text == ""


class RestatingBackend(FakeBackend):
    """Every branch opens by restating the question, then says something."""

    async def generate(self, request, on_text=None):
        if request.tag.role != BRANCH:
            return await super().generate(request, on_text)
        self.requests.append(request)
        return await self._reply("Improving time management matters. Point {} says more.".format(request.tag.point + 1),
                                 request, on_text)  # fmt: skip


def test_the_answer_and_its_stream_drop_an_opening_sentence_that_restates_the_question():
    streamed = []
    answer = run(run_sot(QUESTION, RestatingBackend(), render, SoTOptions(mode="on"),
                         on_delta=lambda channel, text: streamed.append((channel, text))))  # fmt: skip
    assert answer.path == SOT and "matters" not in answer.answer
    assert answer.answer.splitlines()[0] == "1. **Plan the day**: Point 1 says more."
    assert "".join(text for channel, text in streamed if channel == ANSWER_CHANNEL) == answer.answer
