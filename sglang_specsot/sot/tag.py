"""The SoT tag: which answer, role and point a generation belongs to. One writer, one reader.

The SoT program (frontend or server-side) writes it into each request's
`sampling_params.custom_params["specsot"]` as `{"group": str, "role": "skeleton"|"branch"|
"plain", "point": int, "n": int}`; the SPECSOT worker reads it back with `SoTTag.parse` to let
the branches of one answer draft from each other. A malformed tag is not an error for the
request (it still decodes, losslessly): the reader reports the problem and treats it as plain.
Plain Python.
"""

from __future__ import annotations

from dataclasses import dataclass

CUSTOM_PARAMS_KEY = "specsot"
PLAIN, SKELETON, BRANCH = "plain", "skeleton", "branch"
ROLES = (PLAIN, SKELETON, BRANCH)
# How a caller asks for SoT: "auto" lets the router decide, "on" always tries, "off" never.
MODES = ("auto", "on", "off")
MAX_POINTS = 64
MAX_GROUP_CHARS = 128


@dataclass(frozen=True, slots=True)
class SoTTag:
    """One generation's place in an SoT answer; validated at construction (ValueError)."""

    group: str | None = None  # one id per answer, shared by its skeleton and branches
    role: str = PLAIN
    point: int | None = None  # 0-based skeleton index, set exactly for a branch
    n: int | None = None  # number of branches of the answer, set exactly for a branch

    def __post_init__(self) -> None:
        problem = _problem(self.group, self.role, self.point, self.n)
        if problem is not None:
            raise ValueError(f"invalid SoT tag: {problem}")

    @property
    def is_branch(self) -> bool:
        return self.role == BRANCH

    def to_custom_params(self) -> dict[str, dict[str, str | int]]:
        """The `custom_params` entry that carries this tag to the server."""
        tag: dict[str, str | int] = {"role": self.role}
        if self.group is not None:
            tag["group"] = self.group
        if self.point is not None:
            tag["point"] = self.point
            tag["n"] = self.n
        return {CUSTOM_PARAMS_KEY: tag}

    @classmethod
    def parse(cls, custom_params: object) -> tuple[SoTTag, str | None]:
        """(tag, problem) from a request's `custom_params`; problem is None when the tag is
        absent (plain) or well-formed, else it says what is wrong and the tag is plain."""
        if not isinstance(custom_params, dict) or CUSTOM_PARAMS_KEY not in custom_params:
            return PLAIN_TAG, None
        raw = custom_params[CUSTOM_PARAMS_KEY]
        if not isinstance(raw, dict):
            return PLAIN_TAG, f"custom_params.{CUSTOM_PARAMS_KEY} must be an object, got {type(raw).__name__}"
        role, group = raw.get("role", PLAIN), raw.get("group")
        point, n = (raw.get("point"), raw.get("n")) if role == BRANCH else (None, None)
        if role == PLAIN:  # a plain request's group (if any) plays no part in drafting
            return PLAIN_TAG, None
        problem = _problem(group, role, point, n)
        if problem is not None:
            return PLAIN_TAG, problem
        return cls(group, role, point, n), None


def _problem(group: object, role: object, point: object, n: object) -> str | None:
    if role not in ROLES:
        return f"role must be one of {ROLES}, got {role!r}"
    if group is not None and not (isinstance(group, str) and 0 < len(group) <= MAX_GROUP_CHARS):
        return f"group must be a non-empty string of at most {MAX_GROUP_CHARS} characters, got {group!r}"
    if role != PLAIN and group is None:
        return f"a {role} needs a group"
    if role != BRANCH:
        if point is not None or n is not None:
            return f"only a branch has point and n, got point={point!r}, n={n!r} for a {role}"
        return None
    if not (_is_int(n) and 1 <= n <= MAX_POINTS):
        return f"a branch needs 1 <= n <= {MAX_POINTS}, got n={n!r}"
    if not (_is_int(point) and 0 <= point < n):
        return f"a branch needs 0 <= point < n, got point={point!r}, n={n}"
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


PLAIN_TAG = SoTTag()  # untagged requests, and tags that did not parse
