"""The verify widths a step may take: its tiers.

A CUDA graph replays one shape. SGLang's decode graph runner captures TARGET_VERIFY at one
per-request width and refuses any other (decode_cuda_graph_runner.py:861-869: a batch whose
`num_tokens_per_req` differs from `captured_req_width` runs eagerly); its adaptive speculation
keeps graphs by capturing one runtime state per candidate width (adaptive_runtime_state.py).
SPECSOT sizes each step's trees from measured costs, so its widths vary step by step: where
graphs replay, each step's trees are padded to the smallest captured width that holds them,
and the policy prices a width at the tier it pads to (a padded row costs what a real one does).

Width 1 is a tier: a step that drafts nothing verifies one row per request, a plain decode.
Where verify runs eagerly (a CPU) every width is its own tier and nothing is padded.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass, field

TIERS_ENV = "SGLANG_SPECSOT_VERIFY_TIERS"  # comma-separated widths, e.g. "1,2,4,8"


@dataclass(frozen=True)
class VerifyTiers:
    """The captured verify widths, ascending; the widest is the verify window."""

    widths: tuple[int, ...]

    def __post_init__(self) -> None:
        w = self.widths
        if not w or w[0] != 1 or list(w) != sorted(set(w)):
            raise ValueError(f"verify tiers {list(w)}: use ascending distinct widths starting at 1 (a plain step)")

    @classmethod
    def every(cls, window: int) -> VerifyTiers:
        """Every width up to the window: an eager verify pads nothing."""
        return cls(tuple(range(1, window + 1)))

    @classmethod
    def powers(cls, window: int) -> VerifyTiers:
        """1, 2, 4, ... below the window, and the window: at most one row in two is padding
        (never more than the next power of two), with log2(window) + 1 graph sets."""
        widths, w = [], 1
        while w < window:
            widths.append(w)
            w *= 2
        return cls((*widths, window))

    @classmethod
    def parse(cls, text: str, window: int) -> VerifyTiers:
        """`text` ("1,2,4,8") as tiers for a window of `window` rows; a ValueError names the fix."""
        try:
            widths = tuple(int(part) for part in text.split(","))
        except ValueError:
            raise ValueError(f"{TIERS_ENV}={text!r}: use comma-separated widths such as '1,2,4,{window}'") from None
        if widths[-1:] != (window,):
            raise ValueError(
                f"{TIERS_ENV}={text!r}: the widest tier must be the verify window, {window} "
                "(--speculative-num-draft-tokens); end the list with it"
            )
        return cls(widths)

    @classmethod
    def for_graphs(cls, window: int, draft_model: bool) -> VerifyTiers:
        """The tiers of a verify that replays graphs: SGLANG_SPECSOT_VERIFY_TIERS where set;
        else with a draft model 1 and the window (SGLang captures the draft's draft-extend
        graph at the window, so a drafting step verifies the full window and its extend
        replays; a plain step's one-row extend runs eagerly), else `powers`."""
        text = os.environ.get(TIERS_ENV, "")
        if text:
            return cls.parse(text, window)
        return cls((1, window)) if draft_model and window > 1 else cls.powers(window)

    @property
    def window(self) -> int:
        return self.widths[-1]

    def padded(self, width: int) -> int:
        """The smallest tier that holds `width` rows per request."""
        if not 1 <= width <= self.window:
            raise ValueError(f"verify width {width} is outside 1..{self.window} (the verify window)")
        return self.widths[bisect.bisect_left(self.widths, width)]


@dataclass
class TierCounts:
    """How each decode step's verify ran: per width, steps that replayed a graph, and steps
    that ran eagerly. In /server_info, so a test (or a user) can see that graphs replay."""

    replayed: dict[int, int] = field(default_factory=dict)
    eager: dict[int, int] = field(default_factory=dict)

    def count(self, width: int, replayed: bool) -> None:
        book = self.replayed if replayed else self.eager
        book[width] = book.get(width, 0) + 1

    def info(self) -> dict:
        return {
            "replayed_by_width": {str(w): n for w, n in sorted(self.replayed.items())},
            "eager_by_width": {str(w): n for w, n in sorted(self.eager.items())},
        }
