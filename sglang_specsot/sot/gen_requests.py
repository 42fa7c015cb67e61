"""The generation requests of an SoT answer's phases: the normal answer, the skeleton, one
per branch and a branch's retry, and the prefix a fork commits once for all branches.

Shared by the runner (server-side SoT) and the frontend program, so both send the same
prompts under the same budgets and tags.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable

from sglang_specsot.sot.budget import skeleton_budget
from sglang_specsot.sot.options import SoTOptions
from sglang_specsot.sot.phase_steps import merged_point
from sglang_specsot.sot.phases import GenRequest, GenResult, ended_by
from sglang_specsot.sot.planner import Branch, BranchPlan, point_aim
from sglang_specsot.sot.prompts import expansion_prompt, normal_messages, skeleton_prompt
from sglang_specsot.sot.tag import BRANCH, PLAIN, SKELETON, SoTTag

Render = Callable[[list[dict[str, str]]], str]  # messages -> prompt text, generation prompt added


def new_group() -> str:
    return uuid.uuid4().hex


def plain_request(
    question: str, render: Render, options: SoTOptions, group: str, budget: int | None = None
) -> GenRequest:
    """The normal answer; `budget` is what the cap left after a skeleton (default: the cap)."""
    prompt = render(normal_messages(question, options.system_prompt))
    cap = options.max_new_tokens if budget is None else budget
    return GenRequest(prompt, cap, SoTTag(group, PLAIN))


def skeleton_request(question: str, render: Render, options: SoTOptions, group: str) -> GenRequest:
    chat = skeleton_prompt(question, instructions=options.system_prompt)
    return GenRequest(
        chat.render(render),
        skeleton_budget(options.config, options.max_new_tokens),
        SoTTag(group, SKELETON),
        chat.assistant_prefix,
        options.skeleton_logit_processor,
    )


def branch_requests(
    question: str, plan: BranchPlan, render: Render, options: SoTOptions, group: str
) -> dict[int, GenRequest]:
    """One request per planned branch, keyed by skeleton index (budgets already fit the cap)."""
    points, n = plan.points, len(plan.branches)
    requests = {}
    for branch in plan.branches:
        chat = expansion_prompt(
            question, points, branch.index, instructions=options.system_prompt,
        )  # fmt: skip
        requests[branch.index] = GenRequest(
            chat.render(render),
            branch.max_new_tokens,
            SoTTag(group, BRANCH, branch.index, n),
            chat.assistant_prefix,
            stop_on_loop=True,
            end_after=_end_after(branch, plan),
        )
    return requests


def _end_after(branch: Branch, plan: BranchPlan) -> int | None:
    """Where a branch may end at its next sentence: its aimed length, within its budget."""
    aim = point_aim(branch.predicted_tokens, plan.point_tokens)
    return None if aim is None else min(aim, branch.max_new_tokens)


# A retried branch needs room to write a sentence or two; with less left it keeps its title.
RETRY_MIN_TOKENS = 16


def retry_request(
    question: str, plan: BranchPlan, render: Render, options: SoTOptions, first: GenRequest, result: GenResult
) -> GenRequest | None:
    """A second request for a branch that wrote no content after its title lead-in, or None
    when the first answer stands.

    A branch is pre-filled with its title ("**Use a planner**:"); a small model sometimes ends
    right there, which leaves the point empty. Asked again with nothing pre-filled, it writes
    the point in its own words (the merge strips a title it echoes). Asked once: a second try
    without the lead-in is not asked again. The retry gets what is left of the branch's budget,
    so the answer stays within its cap."""
    index, points = first.tag.point, plan.points
    if not options.config.retry_empty_points or result.finish_reason != "stop" or ended_by(result) != "stop":
        return None
    if not first.prefill or merged_point(points, index, result.text).expansion:
        return None
    left = first.max_new_tokens - result.completion_tokens
    if left < RETRY_MIN_TOKENS:
        return None
    chat = expansion_prompt(question, points, index, instructions=options.system_prompt, lead_in=False)
    end_after = None if first.end_after is None else max(1, min(left, first.end_after - result.completion_tokens))
    return GenRequest(chat.render(render), left, first.tag, chat.assistant_prefix, stop_on_loop=first.stop_on_loop,
                      end_after=end_after)  # fmt: skip


def shared_prefix(prompts: Iterable[str]) -> str:
    """The text every prompt starts with, up to its last line break: what a fork commits once
    for all branches.

    Cut at a line break because the radix cache matches tokens, not characters: a prefix
    ending mid-line ("...Write only point ") can tokenize differently alone than inside the
    full prompt, and then the branches would match less of it than was committed.
    """
    common = os.path.commonprefix(list(prompts))  # character-wise, despite its module
    return common[: common.rfind("\n") + 1]
