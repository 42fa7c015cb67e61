"""The server's limits on what one SoT request may spawn: the one home of every bound.

A client tunes its answer through `specsot.config` (a `SoTConfig`); the server operator bounds
those settings here, so no single request can occupy the server (60 branches of 1M tokens).
The server reads them once from SGLANG_SPECSOT_LIMITS, a JSON object of `SoTLimits` fields
(serving/field.py). Per limit, what happens beyond it:

- a client's explicit `specsot.config` value above a limit: ValueError (HTTP 400) naming both;
- a `SoTConfig` default above a limit (the operator lowered it): clamped to the limit;
- `max_answer_tokens`: the answer's total cap is min(the client's max_tokens, this), a clamp;
- `max_question_chars`: a longer question is answered normally (mode "auto") or refused
  with HTTP 400 (mode "on"), by the chat route;
- `max_groups` / `max_waiting_groups`: SoT answers beyond `max_groups` wait in a FIFO queue;
  beyond `max_waiting_groups` waiting, HTTP 429 (serving/gate.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace

from sglang_specsot.sot.config import SoTConfig
from sglang_specsot.sot.tag import MAX_POINTS

LIMITS_ENV = "SGLANG_SPECSOT_LIMITS"


@dataclass(frozen=True, slots=True)
class SoTLimits:
    """Upper bounds on one SoT request and on SoT answers server-wide; immutable."""

    max_branches: int = 16  # bounds SoTConfig.max_points and max_branches
    max_running: int = 8  # bounds SoTConfig.max_running (branches decoding at once)
    max_branch_tokens: int = 1024  # bounds every branch budget (min/default/max_branch_tokens)
    max_skeleton_tokens: int = 512  # bounds SoTConfig.skeleton_max_tokens
    max_answer_tokens: int = 4096  # completion tokens of one SoT answer: skeleton + branches
    max_question_chars: int = 16_000  # every branch prompt repeats the question
    max_groups: int = 4  # SoT answers running at once, server-wide
    max_waiting_groups: int = 32  # SoT answers queued for a slot; more get HTTP 429

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{LIMITS_ENV}: {f.name}={value!r} must be a non-negative integer")
        # Below these no default SoT answer can run at all; say so at start-up, not per request.
        floors = {"max_branches": 2, "max_running": 1, "max_branch_tokens": 1,
                  "max_skeleton_tokens": 1, "max_answer_tokens": 1, "max_groups": 1}  # fmt: skip
        for name, floor in floors.items():
            if getattr(self, name) < floor:
                raise ValueError(
                    f"{LIMITS_ENV}: {name}={getattr(self, name)} is below {floor}, so no SoT "
                    f"answer could run; set it to at least {floor} (or SGLANG_SPECSOT_SOT_MODE=off)"
                )
        if self.max_branches > MAX_POINTS:  # the drafter's tag numbers at most this many branches
            raise ValueError(f"{LIMITS_ENV}: max_branches={self.max_branches} is above {MAX_POINTS}, "
                             f"the most branches an SoT tag can number; set it to at most {MAX_POINTS}")


# SoTConfig field -> the limit that bounds it.
BOUNDED_FIELDS = {
    "max_points": "max_branches",
    "max_branches": "max_branches",
    "max_running": "max_running",
    "min_branch_tokens": "max_branch_tokens",
    "default_branch_tokens": "max_branch_tokens",
    "max_branch_tokens": "max_branch_tokens",
    "skeleton_max_tokens": "max_skeleton_tokens",
}


def limits_from_json(text: str | None) -> SoTLimits:
    """SoTLimits from a JSON object of its fields (the environment variable's value)."""
    if text is None or not text.strip():
        return SoTLimits()
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{LIMITS_ENV} is not JSON ({exc}); use e.g. '{{\"max_branches\": 8}}'") from None
    if not isinstance(values, dict):
        raise ValueError(f"{LIMITS_ENV} must be a JSON object such as {{\"max_branches\": 8}}, got {text!r}")
    known = [f.name for f in fields(SoTLimits)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{LIMITS_ENV} has unknown keys {unknown}; known keys are {known}")
    return SoTLimits(**values)


def bound_config(config: SoTConfig, limits: SoTLimits, explicit: frozenset[str] | set[str] = frozenset()) -> SoTConfig:
    """`config` within `limits`: ValueError for an `explicit` (client-sent) field above its
    limit, a clamp for a default above it."""
    clamped = {}
    for name, limit_name in BOUNDED_FIELDS.items():
        value, limit = getattr(config, name), getattr(limits, limit_name)
        if value is None or value <= limit:
            continue
        if name in explicit:
            raise ValueError(
                f'"specsot.config.{name}"={value} is above the server limit {limit_name}={limit}; '
                f"send at most {limit} (the server operator sets limits in {LIMITS_ENV})"
            )
        clamped[name] = limit
    return replace(config, **clamped) if clamped else config


def answer_cap(max_tokens: int | None, limits: SoTLimits) -> int:
    """The total completion tokens an SoT answer may use: the client's cap within the limit."""
    return limits.max_answer_tokens if max_tokens is None else min(max_tokens, limits.max_answer_tokens)
