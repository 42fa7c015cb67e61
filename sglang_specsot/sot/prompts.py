"""SoT prompts as chat messages plus an assistant prefix; the caller applies the chat template.

The core cannot import a tokenizer, so every prompt is a `ChatPrompt`: `messages` goes
through the model's own chat template (with the generation prompt added) and
`assistant_prefix` is appended to the rendered text, pre-filling the assistant's turn.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# The skeleton's assistant turn starts with this, so the model continues a numbered list.
SKELETON_PREFILL = "1."
ROUTE_LIST, ROUTE_DIRECT = "LIST", "DIRECT"

_SKELETON_SYSTEM = (
    "You are an organizer. You never write the answer itself; you plan it. Given a "
    "question, reply only with the skeleton of a good answer: a numbered list of the distinct "
    "points a complete answer covers, as many as the question needs (a narrow question needs "
    "three, a broad one up to eight), each 2 to 6 words, one point per line. No two points may "
    "cover the same idea, and every point keeps to the question's situation. Do not explain the "
    "points and stop after the last one."
)
# Worked examples, given as earlier turns so even small models copy the format. Their lengths
# differ (4, 3 and 7 points) and the broad question comes last: with examples of 4 and 5 points
# the 1.5B planned 5 points for every question, and with 6, 3, 4 it planned 3 or 4 for eight
# tuning questions whose normal answers list 5 to 10 items; with these, 4 to 7.
_SKELETON_EXAMPLES = (
    (
        "What are some good habits for sleeping better?",
        "1. Keep a regular bedtime\n2. Limit screens before bed\n3. Avoid late caffeine\n"
        "4. Keep the bedroom dark",
    ),
    (
        "What is the difference between weather and climate?",
        "1. The time scale\n2. What each describes\n3. How each is predicted",
    ),
    (
        "What should I know before starting a small business?",
        "1. Validate the idea\n2. Know your customers\n3. Write a business plan\n4. Plan the finances\n"
        "5. Choose a legal structure\n6. Handle taxes and permits\n7. Build a support network",
    ),
)
_EXPAND_SYSTEM = (
    "You are a helpful assistant writing one part of a longer answer. Other writers "
    "handle the other parts at the same time."
)
# The client's own system prompt (persona, language, tone) goes with every SoT prompt: the
# skeleton is planned for it and each point is written under it, as the normal answer is.
# A branch gets them twice, after our system prompt and again just before the point to
# write: small models follow an instruction such as "Always answer in French." in more of
# the points with both placements than with either alone.
_SKELETON_INSTRUCTIONS = "The answer will be written under these instructions; plan it for them:\n{instructions}"
_EXPAND_INSTRUCTIONS = "The user's instructions, which your part follows too:\n{instructions}"
_EXPAND_REMINDER = "Follow the user's instructions: {instructions}\n"
# What a point is asked for: what a point of a complete answer needs, not a share of a total
# length. The 1.5B's sentences are about 19 tokens (median, tuning answers); a branch ends at
# its first sentence end past its aim (sot.budget.POINT_AIM_TOKENS), about three sentences.
POINT_LENGTH = "two to four sentences"
# A worked point, given as an earlier turn: told in words alone not to, the 1.5B still opened
# most points with a sentence restating the title or the question ("The smartphone has
# revolutionized communication by ..."); an example that opens on a fact is what small models copy.
# It is a point of the weather-and-climate example, far from the advice questions SoT mostly
# answers: a point of the sleep example leaked its topic into a screen-time answer ("Breaks are
# important for maintaining good sleep").
_EXPAND_EXAMPLE = 1  # the worked point: "The time scale" of this skeleton example
_EXPAND_EXAMPLE_POINT = 0
_EXPAND_EXAMPLE_BODY = (
    "Weather is the state of the air over hours or days: this afternoon's rain, next week's heat. "
    "Climate is the average of that weather over 30 years or more, so one cold winter says little "
    "about it, while a decade of warmer winters does."
)
_ROUTE_SYSTEM = "You decide how a question should be answered. You reply with one word."
_ROUTE_USER = (
    "Question: {question}\n\n"
    "Could a good answer be written as several independent points, each of which could be "
    "written without seeing the others (for example ways, tips, reasons, factors or "
    f"differences)? Reply {ROUTE_LIST} if so. Reply {ROUTE_DIRECT} if the answer has to be one "
    "connected piece: code, math, a count or estimate, a single fact, a yes/no or either-or "
    "opinion, role-play, a letter, story or other piece of writing, or a required output "
    f"format such as JSON. Reply with exactly one word: {ROUTE_LIST} or {ROUTE_DIRECT}."
)


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """Chat turns as (role, content) pairs, and the text that pre-fills the assistant turn."""

    turns: tuple[tuple[str, str], ...]
    assistant_prefix: str = ""

    @property
    def messages(self) -> list[dict[str, str]]:
        """The turns as OpenAI-style message dicts; a fresh list each call."""
        return [{"role": role, "content": content} for role, content in self.turns]

    def render(self, apply_chat_template: Callable[[list[dict[str, str]]], str]) -> str:
        """Prompt text: `apply_chat_template` must add the generation prompt itself."""
        return apply_chat_template(self.messages) + self.assistant_prefix


def format_skeleton(points: Sequence[str]) -> str:
    """The skeleton as the model should see it: one numbered point per line."""
    return "\n".join(f"{i}. {point}" for i, point in enumerate(points, start=1))


def normal_messages(question: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The chat a normal answer is asked in: the client's system prompt, if any, then the question."""
    system = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    return [*system, {"role": "user", "content": question}]


def skeleton_prompt(question: str, *, instructions: str | None = None, system_role: bool = True) -> ChatPrompt:
    """Ask for a numbered skeleton of 3-10 short points, pre-filled with '1.'.

    `instructions` is the client's system prompt, if any: the plan is made for it.
    """
    turns: list[tuple[str, str]] = []
    for example_question, example_skeleton in _SKELETON_EXAMPLES:
        turns += [("user", example_question), ("assistant", example_skeleton)]
    turns.append(("user", question))
    system = _SKELETON_SYSTEM
    if instructions:  # after the organizer's own instructions, which stay first
        system += "\n\n" + _SKELETON_INSTRUCTIONS.format(instructions=instructions)
    return ChatPrompt(_with_system(system, turns, system_role), SKELETON_PREFILL)


def title_lead_in(point: str) -> str:
    """The point's title in bold and a colon ("**Use a planner**:"; a question or exclamation
    keeps its mark and needs no colon: "**Why rest?**"): what each branch's answer is pre-filled
    with, and how the merge shows the point (merge._format)."""
    title = point.rstrip(" .:;")
    return f"**{title}**" if title.endswith(("?", "!")) else f"**{title}**:"


def expansion_prompt(
    question: str,
    points: Sequence[str],
    index: int,
    *,
    instructions: str | None = None,
    system_role: bool = True,
    lead_in: bool = True,
) -> ChatPrompt:
    """Ask to write only point `index` (0-based) as a short paragraph, seeing the whole skeleton.

    The assistant turn is pre-filled with the point's title in bold and a colon
    (`title_lead_in`), so the branch writes the point's content and cannot run its title into a
    sentence: an imperative title continued as a subject ("Take breaks are crucial") is what a
    bare title followed by the branch's text reads as. `lead_in=False` pre-fills nothing: how a
    branch that ended right after its lead-in is asked again (gen_requests.retry_request).

    `instructions` is the client's system prompt, if any: each point is written under it.

    A paragraph of what the point needs (POINT_LENGTH), not the SoT paper's "1-2 sentences": the
    joined answer has to say what the normal answer says, and one sentence per point says too
    little.
    """
    if not 0 <= index < len(points):
        raise ValueError(
            f"index={index} is outside the skeleton's {len(points)} points; pass a 0-based "
            f"index in [0, {len(points) - 1}]"
        )
    # The worked example and everything before the user turn's last line are the same for every
    # point, so the branches of one question share them in the radix cache and each prefills
    # only that line: the instructions come first, the point to write last.
    turns = [*_example_turns(), ("user", _expand_user(question, points, index, instructions))]
    prefix = title_lead_in(points[index]) if lead_in else ""
    system = _EXPAND_SYSTEM
    if instructions:
        system += "\n\n" + _EXPAND_INSTRUCTIONS.format(instructions=instructions)
    return ChatPrompt(_with_system(system, turns, system_role), prefix)


@functools.cache
def _example_turns() -> tuple[tuple[str, str], tuple[str, str]]:
    """The worked point as a (user, assistant) exchange, built once: it never changes."""
    example_question, example_skeleton = _SKELETON_EXAMPLES[_EXPAND_EXAMPLE]
    example_points = [line.split(". ", 1)[1] for line in example_skeleton.split("\n")]
    lead_in = title_lead_in(example_points[_EXPAND_EXAMPLE_POINT])
    return (("user", _expand_user(example_question, example_points, _EXPAND_EXAMPLE_POINT, None)),
            ("assistant", f"{lead_in} {_EXPAND_EXAMPLE_BODY}"))  # fmt: skip


def _expand_user(question: str, points: Sequence[str], index: int, instructions: str | None) -> str:
    number, point = index + 1, points[index]
    return (
        f"Question: {question}\n\nThe answer follows this skeleton:\n"
        f"{format_skeleton(points)}\n\n"
        f"You write the body of one of these points: {POINT_LENGTH} of prose, one paragraph without a list, "
        "with the specific facts, examples, steps or reasons a complete answer gives for it. Its title is "
        "already written: open "
        "with a specific fact, example, step or reason, not with a general sentence that repeats the title "
        "or the question. Other writers cover the other points: say nothing that belongs to them. Do not "
        "number your text and stop before any other point.\n"
        + (_EXPAND_REMINDER.format(instructions=instructions) if instructions else "")
        + f'Write only point {number}, "{point}".'
    )


def route_prompt(question: str, *, system_role: bool = True) -> ChatPrompt:
    """Ask the model whether the question suits SoT; read the reply with `parse_route_reply`."""
    user = _ROUTE_USER.format(question=question)
    return ChatPrompt(_with_system(_ROUTE_SYSTEM, [("user", user)], system_role))


def _with_system(
    system: str, turns: list[tuple[str, str]], system_role: bool
) -> tuple[tuple[str, str], ...]:
    # Some chat templates (Gemma's, for one) reject a system role: fold it into the first turn.
    if system_role:
        return (("system", system), *turns)
    (role, content), rest = turns[0], turns[1:]
    return ((role, f"{system}\n\n{content}"), *rest)
