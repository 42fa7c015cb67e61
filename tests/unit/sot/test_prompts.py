"""Prompt structure: chat messages plus an assistant prefix, as the SoT recipe describes."""

from __future__ import annotations

import pytest

from sglang_specsot.sot import (
    SKELETON_PREFILL,
    expansion_prompt,
    format_skeleton,
    parse_skeleton,
    skeleton_prompt,
)
from sglang_specsot.sot.prompts import POINT_LENGTH, title_lead_in

QUESTION = "How can I improve my time management skills?"
POINTS = ["Set clear goals", "Prioritize tasks", "Take breaks"]


def test_skeleton_prompt_has_organizer_role_three_examples_and_prefill():
    prompt = skeleton_prompt(QUESTION)
    roles = [m["role"] for m in prompt.messages]
    assert roles == ["system", *["user", "assistant"] * 3, "user"]
    assert "organizer" in prompt.messages[0]["content"]
    assert "as many as the question needs" in prompt.messages[0]["content"]
    assert "No two points may cover the same idea" in prompt.messages[0]["content"]
    assert prompt.messages[-1]["content"] == QUESTION
    assert prompt.assistant_prefix == SKELETON_PREFILL == "1."


def test_worked_examples_parse_as_plans_of_short_points():
    prompt = skeleton_prompt(QUESTION)
    for message in prompt.messages:
        if message["role"] == "assistant":
            parse = parse_skeleton(message["content"], prefill="")
            assert parse.is_plan and 3 <= len(parse.points) <= 8
            assert all(2 <= len(p.split()) <= 6 for p in parse.texts), parse.texts
    # Examples of several lengths, so a small model does not copy one point count.
    counts = [len(parse_skeleton(m["content"], prefill="").points) for m in prompt.messages if m["role"] == "assistant"]
    assert len(set(counts)) == len(counts)


def test_system_role_can_be_folded_into_the_first_user_turn():
    prompt = skeleton_prompt(QUESTION, system_role=False)
    assert prompt.messages[0]["role"] == "user"
    assert prompt.messages[0]["content"].startswith("You are an organizer")
    assert prompt.messages[-1]["content"] == QUESTION


def test_expansion_prompt_sees_question_and_whole_skeleton():
    prompt = expansion_prompt(QUESTION, POINTS, 1)
    user = prompt.messages[-1]["content"]
    assert QUESTION in user and format_skeleton(POINTS) in user
    assert 'point 2, "Prioritize tasks"' in user and "two to four sentences" in user
    assert "not with a general sentence that repeats the title" in user
    assert "say nothing that belongs to them" in user
    # The title is pre-filled in bold with a colon, so the branch writes only the content and
    # cannot run the title into its first sentence ("Take breaks are crucial").
    assert prompt.assistant_prefix == "**Prioritize tasks**:"
    # A retried branch gets the same prompt with nothing pre-filled.
    bare = expansion_prompt(QUESTION, POINTS, 1, lead_in=False)
    assert bare.assistant_prefix == "" and bare.messages == prompt.messages
    assert expansion_prompt(QUESTION, ["Why rest?", "Sleep.", "Eat"], 0).assistant_prefix == "**Why rest?**"
    assert title_lead_in("Use a planner.") == "**Use a planner**:"


def test_expansion_prompts_share_everything_but_the_last_instruction():
    # Shared prefixes are what lets the radix cache reuse the question and skeleton's KV.
    texts = [expansion_prompt(QUESTION, POINTS, i).messages[-1]["content"] for i in range(3)]
    shared = texts[0].split("Write only point")[0]
    assert all(t.startswith(shared) for t in texts) and format_skeleton(POINTS) in shared


@pytest.mark.parametrize("index", [-1, 3])
def test_expansion_index_out_of_range(index):
    with pytest.raises(ValueError, match=f"index={index} is outside the skeleton's 3 points"):
        expansion_prompt(QUESTION, POINTS, index)


def test_render_appends_the_prefix_after_the_template():
    def template(messages):
        turns = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return turns + "<assistant>"

    text = skeleton_prompt(QUESTION).render(template)
    assert text.endswith(f"<user>{QUESTION}</user><assistant>1.")


def test_messages_are_fresh_copies():
    prompt = skeleton_prompt(QUESTION)
    prompt.messages[0]["content"] = "tampered"
    assert prompt.messages[0]["content"] != "tampered"


def test_the_clients_system_prompt_goes_into_every_sot_prompt_after_the_shared_part():
    system = "Always answer in French."
    plain = skeleton_prompt(QUESTION).messages[0]["content"]
    skeleton = skeleton_prompt(QUESTION, instructions=system)
    # The organizer's instructions stay first; the plan is made for the client's.
    assert skeleton.messages[0]["content"].startswith(plain) and skeleton.messages[0]["content"].endswith(system)
    assert skeleton.messages[1:] == skeleton_prompt(QUESTION).messages[1:]
    # A point is written under ours, then the client's instructions, named as the user's.
    expansion = expansion_prompt(QUESTION, POINTS, 1, instructions=system)
    ours = expansion_prompt(QUESTION, POINTS, 1).messages[0]["content"]
    assert expansion.messages[0]["content"].startswith(ours) and expansion.messages[0]["content"].endswith(system)
    assert "user's instructions" in expansion.messages[0]["content"]
    # ... and again just before the point to write, in the part every branch shares.
    user, plain_user = expansion.messages[-1]["content"], expansion_prompt(QUESTION, POINTS, 1).messages[-1]["content"]
    head, last = plain_user.rsplit("\n", 1)
    assert user == f"{head}\nFollow the user's instructions: {system}\n{last}"
    folded = expansion_prompt(QUESTION, POINTS, 1, instructions=system, system_role=False)
    assert folded.messages[0]["role"] == "user" and system in folded.messages[0]["content"]


def test_a_branch_sees_one_worked_point_that_opens_on_a_fact_before_its_own():
    turns = expansion_prompt(QUESTION, POINTS, 2).turns
    assert [role for role, _ in turns] == ["system", "user", "assistant", "user"]
    assert 'Write only point 1, "The time scale".' in turns[1][1]
    assert turns[2][1].startswith("**The time scale**: Weather is the state of the air over hours or days")
    # The example is the same for every point: the branches share it in the radix cache.
    assert expansion_prompt(QUESTION, POINTS, 0).turns[:3] == turns[:3]


def test_every_point_is_asked_for_what_a_point_needs_in_the_shared_part():
    first, second = (expansion_prompt("Q?", ["A", "B", "C", "D", "E", "F"], i).turns[-1][1] for i in (0, 5))
    assert f"the body of one of these points: {POINT_LENGTH} of prose" in first
    shared = first[: first.rfind("\n")]
    assert POINT_LENGTH in shared and second.startswith(shared)  # the radix cache shares it
