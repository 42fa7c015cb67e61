"""What keeping an SoT answer's branches on one data-parallel rank costs against spreading them.

The branch phase of one answer on a server of `ranks` DP ranks (serving/dp_placement.py),
priced as `sot.latency.decide` prices an answer: from a rank's row-cost curve, as a policy
(each of the `shared` other requests on the server is an answer placed alike), a rank's
forward costing the curve at the rows it carries:

    keep    = a * prefill(Pb) + phase(n branches, a forward of n costing step(a * n))
    spread  = b * prefill(Pb) + max over used ranks r of phase(n_r branches, step(b * n_r))

where answers = shared + 1, a = ceil(answers / ranks) the answers a rank is home to, u =
min(ranks, points) the ranks an answer uses, b = ceil(answers * u / ranks) the answers with
branches on a rank, Pb the branches' shared prompt, and n_r the points dealt to rank r (point
i to rank i mod ranks), at most ceil(max_running / u) of them at once. Alone (a = b = 1)
spreading saves what a forward of n rows costs over one of n / u rows and pays no more
prefill, each rank committing the prompt in parallel; with others running a rank carries as
many rows either way, and under spread prefills u times the prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_specsot.sot.latency import AnswerShape, RowCosts, branch_phase_ms


@dataclass(frozen=True, slots=True)
class PlacementCost:
    """Predicted milliseconds of one answer's branch phase (shared-prompt prefill included)."""

    keep_ms: float
    spread_ms: float

    @property
    def ratio(self) -> float:
        """keep / spread: above 1, spreading is predicted faster."""
        return self.keep_ms / max(1e-9, self.spread_ms)


def placement_cost(costs: RowCosts, shape: AnswerShape, ranks: int, shared: int = 0) -> PlacementCost:
    """The branch phase kept on one rank and spread over `ranks` (module doc); ValueError for
    fewer than one rank or a negative `shared`."""
    if ranks < 1 or shared < 0:
        raise ValueError(f"ranks={ranks}, shared={shared}: need at least one rank and no negative request count")
    step, lengths = costs.step_ms, shape.branch_tokens
    answers, used = shared + 1, min(ranks, len(lengths))
    home, visiting = -(-answers // ranks), -(-answers * used // ranks)
    prefill = step(shape.branch_prompt_tokens) if shape.branch_prompt_tokens else 0.0
    at_once = min(len(lengths), shape.max_running)
    keep = home * prefill + branch_phase_ms(lambda n: step(home * n), lengths, at_once)
    dealt = [lengths[r::ranks] for r in range(used)]
    per_rank = -(-at_once // used)  # the answer's `max_running` branches at once, split over its ranks
    phases = [branch_phase_ms(lambda n: step(visiting * n), part, min(len(part), per_rank)) for part in dealt]
    return PlacementCost(keep, visiting * prefill + max(phases))
