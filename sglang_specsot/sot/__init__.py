"""The pure Skeleton-of-Thought core: prompts, skeleton parsing, routing, planning, merging.

Plain Python: nothing here imports SGLang, torch or transformers (a unit test checks it), so
the frontend program and the server-side path share one tested algorithm. The phases:
route_question -> skeleton_prompt -> parse_skeleton -> plan_branches (+ BranchScheduler)
-> expansion_prompt per branch -> merge_answer; each returns one frozen dataclass.
"""

from __future__ import annotations

from sglang_specsot.sot.agreement import (
    LabelledQuestion,
    RouterAgreement,
    load_labelled,
    measure_agreement,
)
from sglang_specsot.sot.config import DEFAULT_CONFIG, SoTConfig
from sglang_specsot.sot.merge import MergedAnswer, MergedPoint, clean_expansion, merge_answer
from sglang_specsot.sot.planner import Branch, BranchPlan, BranchScheduler, plan_branches
from sglang_specsot.sot.prompts import (
    SKELETON_PREFILL,
    ChatPrompt,
    expansion_prompt,
    format_skeleton,
    route_prompt,
    skeleton_prompt,
)
from sglang_specsot.sot.skeleton import (
    DIRECT,
    ERROR,
    PLAN,
    SkeletonParse,
    SkeletonPoint,
    parse_skeleton,
)

# The router's names load on first use, so that `python -m sglang_specsot.sot.router` runs
# the module once (runpy warns when the package import has already loaded it).
_ROUTER_NAMES = ("RouteDecision", "parse_route_reply", "route_question")


def __getattr__(name: str):
    if name in _ROUTER_NAMES:
        from sglang_specsot.sot import router

        return getattr(router, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_CONFIG",
    "DIRECT",
    "ERROR",
    "PLAN",
    "SKELETON_PREFILL",
    "Branch",
    "BranchPlan",
    "BranchScheduler",
    "ChatPrompt",
    "LabelledQuestion",
    "MergedAnswer",
    "MergedPoint",
    "RouteDecision",
    "RouterAgreement",
    "SkeletonParse",
    "SkeletonPoint",
    "SoTConfig",
    "clean_expansion",
    "expansion_prompt",
    "format_skeleton",
    "load_labelled",
    "measure_agreement",
    "merge_answer",
    "parse_route_reply",
    "parse_skeleton",
    "plan_branches",
    "route_prompt",
    "route_question",
    "skeleton_prompt",
]
