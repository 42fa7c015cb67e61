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
from sglang_specsot.sot.prompts import length_phrase

QUESTION = "How can I improve my time management skills?"
POINTS = ["Set clear goals", "Prioritize tasks", "Take breaks"]


def test_skeleton_prompt_has_organizer_role_two_examples_and_prefill():
    prompt = skeleton_prompt(QUESTION)
    roles = [m["role"] for m in prompt.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "organizer" in prompt.messages[0]["content"]
    assert "3 to 10 points" in prompt.messages[0]["content"]
    assert prompt.messages[-1]["content"] == QUESTION
    assert prompt.assistant_prefix == SKELETON_PREFILL == "1."


def test_worked_examples_parse_as_plans_of_short_points():
    prompt = skeleton_prompt(QUESTION)
    for message in prompt.messages:
        if message["role"] == "assistant":
            parse = parse_skeleton(message["content"], prefill="")
            assert parse.is_plan and 3 <= len(parse.points) <= 10
            assert all(3 <= len(p.split()) <= 5 for p in parse.texts), parse.texts


def test_system_role_can_be_folded_into_the_first_user_turn():
    prompt = skeleton_prompt(QUESTION, system_role=False)
    assert prompt.messages[0]["role"] == "user"
    assert prompt.messages[0]["content"].startswith("You are an organizer")
    assert prompt.messages[-1]["content"] == QUESTION


def test_expansion_prompt_sees_question_and_whole_skeleton():
    prompt = expansion_prompt(QUESTION, POINTS, 1)
    user = prompt.messages[-1]["content"]
    assert QUESTION in user and format_skeleton(POINTS) in user
    assert 'point 2, "Prioritize tasks"' in user and "two to four sentences" in user and "do not repeat the point's title" in user
    assert prompt.assistant_prefix == ""
    prefilled = expansion_prompt(QUESTION, POINTS, 1, prefill_header=True)
    assert prefilled.assistant_prefix == "2. Prioritize tasks"
    # A retried branch's answer starts with its title and a colon, whatever the title ends in.
    led = expansion_prompt(QUESTION, POINTS, 1, lead_in=True)
    assert led.assistant_prefix == "Prioritize tasks:" and led.messages == prompt.messages
    assert expansion_prompt(QUESTION, ["Why rest?", "Sleep.", "Eat"], 0, lead_in=True).assistant_prefix == "Why rest:"
    with pytest.raises(ValueError, match="pass at most one"):
        expansion_prompt(QUESTION, POINTS, 1, prefill_header=True, lead_in=True)


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
    user, plain_user = expansion.messages[1]["content"], expansion_prompt(QUESTION, POINTS, 1).messages[1]["content"]
    head, last = plain_user.rsplit("\n", 1)
    assert user == f"{head}\nFollow the user's instructions: {system}\n{last}"
    folded = expansion_prompt(QUESTION, POINTS, 1, instructions=system, system_role=False)
    assert folded.messages[0]["role"] == "user" and system in folded.messages[0]["content"]


@pytest.mark.parametrize("tokens, phrase", [
    (None, "two to four sentences"), (24, "one or two sentences"), (60, "one or two sentences"),
    (61, "two or three sentences"), (90, "two or three sentences"), (130, "three or four sentences"),
    (131, "four to six sentences"),
])  # fmt: skip
def test_a_points_aimed_length_is_asked_as_sentences_in_the_shared_part(tokens, phrase):
    assert length_phrase(tokens) == phrase
    first, second = (expansion_prompt("Q?", ["A", "B"], i, point_tokens=tokens).turns[-1][1] for i in (0, 1))
    assert f"one short paragraph of {phrase}," in first
    shared = first[: first.rfind("\n")]
    assert phrase in shared and second.startswith(shared)  # the radix cache shares it
