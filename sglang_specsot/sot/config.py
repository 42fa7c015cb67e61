"""The one configuration object of the pure SoT core, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_specsot.sot.opening import DEFAULT_OPENING_CHARS

LONG_POINT_POLICIES = ("truncate", "flag")


@dataclass(frozen=True, slots=True)
class SoTConfig:
    """Settings for skeleton parsing, routing, branch planning and merging; immutable."""

    # Skeleton parsing.
    min_points: int = 2  # fewer distinct points than this -> answer normally ("direct")
    max_points: int = 10  # later points are dropped, keeping the skeleton's order
    max_point_words: int = 12  # the prompt asks for 3-5 words; longer is usually prose
    max_point_chars: int = 120
    long_point_policy: str = "truncate"  # "truncate" to a title, or "flag" and keep verbatim
    skeleton_max_tokens: int = 160  # what the caller should pass as the skeleton's max_new_tokens

    # Branch planning.
    max_branches: int | None = None  # None: as many as max_points
    # Branches decoding at once; the rest wait for a free slot. A decode forward costs about
    # the same for 1 to ~8 rows on a CPU (and far more rows on a GPU), so a second wave of
    # branches costs a whole branch duration while an extra row costs almost nothing: run them
    # all (the server bounds it by its max_running limit, 8 by default).
    max_running: int = 8
    # A point's budget where no length is aimed at (a plan made without an expected answer
    # length); the runner always aims (sot/budget.py), so there max_branch_tokens bounds points.
    default_branch_tokens: int = 128
    min_branch_tokens: int = 32
    max_branch_tokens: int = 384
    # A point's aimed length (the skeleton's "(n)" prediction, else budget.POINT_AIM_TOKENS)
    # is a guess the branch keeps only roughly; cutting it mid-sentence costs more
    # quality than a few extra tokens cost time, so budgets get this much headroom over it.
    predicted_length_slack: float = 1.5

    # A branch that ends right after its pre-filled title lead-in ("**Use a planner**:") leaves
    # the point empty; it is asked once more with nothing pre-filled, within what is left of
    # its budget (gen_requests.retry_request).
    retry_empty_points: bool = True

    # A question that names MIN_ITEMS or more items in a series ("compare A, B, C and D")
    # has stated its plan: the items are the points and no skeleton is generated. The answer
    # then covers each named item (a generated skeleton tends to plan by aspect and cover the
    # items as an afterthought) and saves the skeleton's time.
    derive_skeleton: bool = True

    # Routing: SoT loses on short answers, so a request capped below this goes normal.
    router_min_answer_tokens: int = 200

    # Read the normal answer's first line beside the skeleton (sot.opening): prose goes on as
    # the normal answer, an announced list is answered by SoT under its intro line. None: in
    # mode "auto" only (mode "on" asks for SoT whatever the answer's shape); True or False: in
    # both. Only a backend that watches its text as it decodes can (the server's, not the
    # frontend program's).
    read_opening: bool | None = None
    opening_chars: int = DEFAULT_OPENING_CHARS  # a first line longer than this is prose

    def __post_init__(self) -> None:
        self._check_ints()
        self._check_ranges()
        if self.long_point_policy not in LONG_POINT_POLICIES:
            raise ValueError(
                f"long_point_policy={self.long_point_policy!r} is not one of "
                f"{LONG_POINT_POLICIES}; use 'truncate' to cut long points to a title or "
                "'flag' to keep them and list their indices"
            )
        if not isinstance(self.predicted_length_slack, (int, float)) or isinstance(
            self.predicted_length_slack, bool
        ):
            raise ValueError(
                f"predicted_length_slack={self.predicted_length_slack!r} must be a number >= 1.0"
            )
        if not 1.0 <= self.predicted_length_slack <= 4.0:
            raise ValueError(
                f"predicted_length_slack={self.predicted_length_slack} is outside [1.0, 4.0]; "
                "use 1.0 to trust predicted lengths exactly, or a little more for headroom"
            )
        for flag in ("derive_skeleton", "retry_empty_points"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag}={getattr(self, flag)!r} must be True or False")
        if self.read_opening is not None and not isinstance(self.read_opening, bool):
            raise ValueError(
                f"read_opening={self.read_opening!r} must be True, False or None (mode \"auto\" only)"
            )

    def reads_opening(self, mode: str) -> bool:
        """Whether an answer in `mode` reads the normal answer's opening before SoT commits."""
        return mode == "auto" if self.read_opening is None else self.read_opening

    @property
    def branch_cap(self) -> int:
        """The most branches one answer may run: `max_branches`, or `max_points` if unset."""
        return self.max_points if self.max_branches is None else self.max_branches

    def _check_ints(self) -> None:
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if name == "max_branches" and value is None:
                continue
            # bool is an int subclass; True as a count is always a mistake.
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")

    def _check_ranges(self) -> None:
        if self.min_points < 2:
            raise ValueError(
                f"min_points={self.min_points} is below 2; a one-point skeleton has nothing "
                "to run in parallel, so set min_points >= 2"
            )
        if self.max_points < self.min_points:
            raise ValueError(
                f"max_points={self.max_points} is below min_points={self.min_points}; no "
                f"skeleton could ever be a plan, so set max_points >= {self.min_points}"
            )
        if self.max_branches is not None and not (
            self.min_points <= self.max_branches <= self.max_points
        ):
            raise ValueError(
                f"max_branches={self.max_branches} must lie in [min_points, max_points] = "
                f"[{self.min_points}, {self.max_points}] (or be None for max_points): fewer "
                "than min_points branches is not a plan, and points beyond max_points never "
                "reach the planner"
            )
        if not self.min_branch_tokens <= self.default_branch_tokens <= self.max_branch_tokens:
            raise ValueError(
                "branch budgets must satisfy min_branch_tokens <= default_branch_tokens <= "
                f"max_branch_tokens, got {self.min_branch_tokens} <= "
                f"{self.default_branch_tokens} <= {self.max_branch_tokens}; adjust them to fit"
            )


_POSITIVE_INTS = (
    "min_points",
    "max_points",
    "max_point_words",
    "max_point_chars",
    "skeleton_max_tokens",
    "max_branches",
    "max_running",
    "default_branch_tokens",
    "min_branch_tokens",
    "max_branch_tokens",
    "router_min_answer_tokens",
    "opening_chars",
)

DEFAULT_CONFIG = SoTConfig()
