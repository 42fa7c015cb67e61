"""Where an SoT answer's generations run on a server launched with `--dp-size N > 1`.

SGLang's data-parallel controller sends every request to a rank by its load-balance method
(round robin by default, data_parallel_controller.py), so an answer's skeleton and branches
would land on different ranks, each re-prefilling the question and skeleton that only the
skeleton's rank holds in its radix cache. `routed_dp_rank` pins a request to a rank. Two
placements, chosen by SGLANG_SPECSOT_DP_BRANCHES:

- "keep" (the default): the skeleton, the branches' shared-prefix commit and every branch on
  one rank, the answer's home (ranks taken in turn, answer by answer). The prefix is prefilled
  once and the SoT-context drafter sees every sibling.
- "spread": the skeleton on the home rank, the branches dealt over the ranks in turn from it;
  the shared prefix is committed (a zero-token request) on every rank that runs a branch, in
  parallel, before any branch starts, so each branch prefills only its own point line. Each
  rank's drafter votes among the siblings on that rank.

"keep" is the default, by measurement and the latency model (sot/placement_cost.py): with
cheap rows spreading saves little of a step (the model: a few percent alone, a loss with others
running), while it adds a second rank's prefill of the shared prompt and a second scheduler's
fixed cost per step; measured on a 2-core CPU, keeping took 0.85x spread's time alone and 0.86x
with two answers at once (docs/scale-out.md, "Data parallel").

Plain Python: the serving backend reads the server's dp size and passes it in.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

DP_BRANCHES_ENV = "SGLANG_SPECSOT_DP_BRANCHES"
PLACEMENTS = ("keep", "spread")


@dataclass(frozen=True, slots=True)
class Placement:
    """One answer's ranks: None everywhere leaves SGLang's own dispatch (one rank, no DP)."""

    home: int | None  # the skeleton's rank
    ranks: int  # the server's DP ranks
    spread: bool

    def branch_rank(self, point: int) -> int | None:
        """The rank of the branch expanding skeleton point `point` (0-based)."""
        if self.home is None:
            return None
        return (self.home + point) % self.ranks if self.spread else self.home

    def commit_ranks(self, points: list[int]) -> list[int | None]:
        """The ranks that need the branches' shared prefix: those the branches run on."""
        if self.home is None:
            return [None]
        return sorted({self.branch_rank(p) for p in points}, key=lambda r: (r != self.home, r))


def placement_from_env(value: str | None) -> str:
    """The configured placement; ValueError naming the value and the choices."""
    chosen = (value or "keep").strip().lower()
    if chosen not in PLACEMENTS:
        raise ValueError(f"{DP_BRANCHES_ENV}={value!r}: choose one of {list(PLACEMENTS)} (default keep)")
    return chosen


class HomeRanks:
    """The answers' home ranks in turn, as SGLang's round robin deals requests."""

    def __init__(self) -> None:
        self._next = itertools.count()

    def place(self, ranks: int, mode: str, client_rank: int | None = None) -> Placement:
        """A new answer's placement; a client's `routed_dp_rank` is its home and keeps it whole.
        ValueError for a client rank SGLang would refuse, before any generation starts."""
        if client_rank is not None and not 0 <= client_rank < max(ranks, 1):
            raise ValueError(f"routed_dp_rank={client_rank} out of range [0, {max(ranks, 1)}): the server runs "
                             f"{max(ranks, 1)} data-parallel rank(s); send a rank in that range or none")  # fmt: skip
        if ranks <= 1:
            return Placement(home=None, ranks=1, spread=False)
        if client_rank is not None:
            return Placement(home=client_rank, ranks=ranks, spread=False)
        return Placement(home=next(self._next) % ranks, ranks=ranks, spread=mode == "spread")


_homes = HomeRanks()


def dp_branches() -> str:
    """The server's placement setting (checked at start-up by the chat hook)."""
    return placement_from_env(os.environ.get(DP_BRANCHES_ENV))


def place_answer(ranks: int, client_rank: int | None = None) -> Placement:
    """The placement of a new SoT answer on a server with `ranks` DP ranks."""
    return _homes.place(ranks, dp_branches(), client_rank)
