"""The `specsot` field of a chat request, and the server's default for requests without it.

A /v1/chat/completions request opts in with a top-level field (SGLang's ChatCompletionRequest
ignores unknown fields, so it is read from the raw JSON body):

    "specsot": {"mode": "auto" | "on" | "off",        # default "auto"
                "config": {<SoTConfig field>: value},  # optional overrides, e.g. max_running
                "skeleton_logit_processor": "<CustomLogitProcessor.to_str()>"}  # optional

(with the OpenAI client: `extra_body={"specsot": {"mode": "auto"}}`; with bench_serving:
`--extra-request-body '{"specsot": {"mode": "on"}}'`). Behind a gateway that drops unknown
top-level fields (SGLang's older `sglang-router`), the same object travels as
`"chat_template_kwargs": {"specsot": {...}}`. The environment variable
SGLANG_SPECSOT_SOT_MODE (default "off") is the mode of requests without the field, and
SGLANG_SPECSOT_LIMITS (a JSON object of `sot.limits.SoTLimits` fields) bounds what a request's
`config` may ask for. Plain Python.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

from sglang_specsot.sot.config import SoTConfig
from sglang_specsot.sot.limits import LIMITS_ENV, SoTLimits, bound_config, limits_from_json
from sglang_specsot.sot.runner import SoTOptions
from sglang_specsot.sot.tag import MODES

FIELD = "specsot"
CARRIER = "chat_template_kwargs"  # also read from here: see _field_value
MODE_ENV = "SGLANG_SPECSOT_SOT_MODE"
FIELD_KEYS = ("mode", "config", "skeleton_logit_processor")
# For error messages: "auto", "on" or "off".
_MODE_LIST = ", ".join(json.dumps(m) for m in MODES[:-1]) + f" or {json.dumps(MODES[-1])}"


@dataclass(frozen=True, slots=True)
class SoTField:
    """The parsed `specsot` field (or the server default when the request has none)."""

    mode: str
    config: SoTConfig
    skeleton_logit_processor: str | None = None

    def options(self, max_new_tokens: int | None, system_prompt: str | None = None) -> SoTOptions:
        return SoTOptions(self.mode, self.config, max_new_tokens, self.skeleton_logit_processor,
                          system_prompt=system_prompt)  # fmt: skip


def default_mode() -> str:
    """The mode of requests without the field, from SGLANG_SPECSOT_SOT_MODE (default "off")."""
    mode = os.environ.get(MODE_ENV, "off").strip().lower()
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode!r} is not one of {', '.join(map(repr, MODES))}")
    return mode


@functools.cache
def server_limits() -> SoTLimits:
    """The server's SoT limits, read once from SGLANG_SPECSOT_LIMITS (unset: the defaults)."""
    return limits_from_json(os.environ.get(LIMITS_ENV))


def parse_field(body: bytes | None, default: str, limits: SoTLimits = SoTLimits()) -> SoTField:
    """Read the `specsot` field from a raw JSON body (top level, or in `chat_template_kwargs`
    where a gateway drops unknown top-level fields); ValueError (HTTP 400) when malformed, when
    both places hold different values, or when its `config` asks for more than `limits` allow."""
    value = _field_value(_payload(body)) if body and f'"{FIELD}"'.encode() in body else None
    if value is None:  # the cheap test first: most requests lack the field
        return SoTField(default, bound_config(SoTConfig(), limits))
    if not isinstance(value, dict):
        raise ValueError(f'"{FIELD}" must be an object such as {{"mode": "auto"}}, got {_shown(value)}')
    unknown = sorted(set(value) - set(FIELD_KEYS))
    if unknown:
        raise ValueError(f'"{FIELD}" has unknown keys {unknown}; known keys are {list(FIELD_KEYS)}')
    mode = value.get("mode", "auto")
    if mode not in MODES:
        raise ValueError(f'"{FIELD}.mode" must be {_MODE_LIST}, got {_shown(mode)}')
    return SoTField(mode, _config(value.get("config"), limits), _processor(value))


def _field_value(payload: dict) -> object:
    """The field's value: top level, or `chat_template_kwargs.specsot`, the carrier that
    survives SGLang's older router (sglang-router 0.3.2 re-serialises a typed chat request and
    drops unknown top-level fields without an error; its typed request keeps that map)."""
    top = payload.get(FIELD)
    kwargs = payload.get(CARRIER)
    carried = kwargs.get(FIELD) if isinstance(kwargs, dict) else None
    if top is not None and carried is not None and top != carried:
        raise ValueError(
            f'"{FIELD}" and "{CARRIER}.{FIELD}" differ ({_shown(top)} against {_shown(carried)}); '
            "send it in one place (the top level, or chat_template_kwargs behind a gateway that drops it)"
        )
    return top if top is not None else carried


def _payload(body: bytes) -> dict:
    """The body as a JSON object ({} for any other JSON value)."""
    try:
        payload = json.loads(body)
    # Not UTF-8 or not JSON (both ValueErrors), or nested deeper than the parser recurses.
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"the request body is not a JSON object ({type(exc).__name__}: {str(exc)[:120]})") from None
    return payload if isinstance(payload, dict) else {}


def _config(overrides: object, limits: SoTLimits) -> SoTConfig:
    if overrides is None:
        return bound_config(SoTConfig(), limits)
    if not isinstance(overrides, dict):
        raise ValueError(f'"{FIELD}.config" must be an object of SoTConfig fields, got {_shown(overrides)}')
    known = set(SoTConfig.__dataclass_fields__)
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f'"{FIELD}.config" has unknown fields {unknown}; SoTConfig has {sorted(known)}')
    # SoTConfig's own checks raise ValueError naming the field; then the server's limits.
    return bound_config(SoTConfig(**overrides), limits, explicit=set(overrides))


def _shown(value: object, limit: int = 80) -> str:
    """A client's value quoted in an error, cut short: the body may be megabytes."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _processor(value: dict) -> str | None:
    processor = value.get("skeleton_logit_processor")
    if processor is not None and not (isinstance(processor, str) and processor):
        raise ValueError(f'"{FIELD}.skeleton_logit_processor" must be a serialized CustomLogitProcessor string')
    return processor

