"""Per-request SoT metadata, read from `sampling_params.custom_params["specsot"]`.

The SoT program tags every request it sends: `{"group": str, "role": "skeleton"|"branch"|
"plain", "point": int, "n": int}`. Plain Python. Malformed tags are not an error for the
request (it still decodes, losslessly): the worker drafts for it from its own context only
and logs the reason once.
"""

from __future__ import annotations

from dataclasses import dataclass

CUSTOM_PARAMS_KEY = "specsot"
ROLES = ("plain", "skeleton", "branch")
MAX_POINTS = 64


@dataclass(frozen=True)
class SoTMeta:
    """What the drafter needs to know about one request."""

    role: str = "plain"
    group: str | None = None  # requests of one SoT answer share it
    point: int = -1  # branch index, -1 unless role == "branch"
    num_points: int = 0


PLAIN = SoTMeta()


def parse_sot_meta(custom_params: object) -> tuple[SoTMeta, str | None]:
    """(metadata, problem): problem is None when the tag is absent or well-formed."""
    if not isinstance(custom_params, dict) or CUSTOM_PARAMS_KEY not in custom_params:
        return PLAIN, None
    tag = custom_params[CUSTOM_PARAMS_KEY]
    if not isinstance(tag, dict):
        return PLAIN, f"custom_params.{CUSTOM_PARAMS_KEY} must be an object, got {type(tag).__name__}"
    role = tag.get("role", "plain")
    if role not in ROLES:
        return PLAIN, f"role must be one of {ROLES}, got {role!r}"
    group = tag.get("group")
    if role != "plain" and (not isinstance(group, str) or not group or len(group) > 128):
        return PLAIN, f"a {role} request needs a non-empty string group (<=128 chars), got {group!r}"
    if role != "branch":
        return SoTMeta(role=role, group=group if role != "plain" else None), None
    point, n = tag.get("point"), tag.get("n")
    if not (isinstance(n, int) and 1 <= n <= MAX_POINTS):
        return PLAIN, f"a branch needs 1 <= n <= {MAX_POINTS}, got n={n!r}"
    if not (isinstance(point, int) and 0 <= point < n):
        return PLAIN, f"a branch needs 0 <= point < n, got point={point!r}, n={n}"
    return SoTMeta(role=role, group=group, point=point, num_points=n), None
