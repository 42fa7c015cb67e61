"""The `specsot` field of a chat request, and the server's default for requests without it.

A /v1/chat/completions request opts in with a top-level field (SGLang's ChatCompletionRequest
ignores unknown fields, so it is read from the raw JSON body):

    "specsot": {"mode": "auto" | "on" | "off",        # default "auto"
                "config": {<SoTConfig field>: value},  # optional overrides, e.g. max_running
                "skeleton_logit_processor": "<CustomLogitProcessor.to_str()>"}  # optional

(with the OpenAI client: `extra_body={"specsot": {"mode": "auto"}}`; with bench_serving:
`--extra-request-body '{"specsot": {"mode": "on"}}'`). The environment variable
SGLANG_SPECSOT_SOT_MODE (default "off") is the mode of requests without the field. Plain Python.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from sglang_specsot.sot.config import SoTConfig
from sglang_specsot.sot.runner import SoTOptions
from sglang_specsot.sot.tag import MODES

FIELD = "specsot"
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

    def options(self, max_new_tokens: int | None) -> SoTOptions:
        return SoTOptions(self.mode, self.config, max_new_tokens, self.skeleton_logit_processor)


def default_mode() -> str:
    """The mode of requests without the field, from SGLANG_SPECSOT_SOT_MODE (default "off")."""
    mode = os.environ.get(MODE_ENV, "off").strip().lower()
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode!r} is not one of {', '.join(map(repr, MODES))}")
    return mode


def parse_field(body: bytes | None, default: str) -> SoTField:
    """Read the `specsot` field from a raw JSON body; ValueError (HTTP 400) when malformed."""
    value = None
    if body and f'"{FIELD}"'.encode() in body:  # cheap test first: most requests lack it
        payload = json.loads(body)
        value = payload.get(FIELD) if isinstance(payload, dict) else None
    if value is None:
        return SoTField(default, SoTConfig())
    if not isinstance(value, dict):
        raise ValueError(f'"{FIELD}" must be an object such as {{"mode": "auto"}}, got {json.dumps(value)}')
    unknown = sorted(set(value) - set(FIELD_KEYS))
    if unknown:
        raise ValueError(f'"{FIELD}" has unknown keys {unknown}; known keys are {list(FIELD_KEYS)}')
    mode = value.get("mode", "auto")
    if mode not in MODES:
        raise ValueError(f'"{FIELD}.mode" must be {_MODE_LIST}, got {json.dumps(mode)}')
    return SoTField(mode, _config(value.get("config")), _processor(value))


def _config(overrides: object) -> SoTConfig:
    if overrides is None:
        return SoTConfig()
    if not isinstance(overrides, dict):
        raise ValueError(f'"{FIELD}.config" must be an object of SoTConfig fields, got {json.dumps(overrides)}')
    known = set(SoTConfig.__dataclass_fields__)
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f'"{FIELD}.config" has unknown fields {unknown}; SoTConfig has {sorted(known)}')
    return SoTConfig(**overrides)  # its own checks raise ValueError naming the field


def _processor(value: dict) -> str | None:
    processor = value.get("skeleton_logit_processor")
    if processor is not None and not (isinstance(processor, str) and processor):
        raise ValueError(f'"{FIELD}.skeleton_logit_processor" must be a serialized CustomLogitProcessor string')
    return processor

