"""Offline speed-up ceilings: the most any budget policy could gain at a measured acceptance,
priced by the cost model or by the step times a server measured (`/server_info`).

Benchmark tooling, not the runtime: the serving path never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sglang_specsot.speculative.policy.chains import pick_runner_ups, runner_up_gains

if TYPE_CHECKING:
    from sglang_specsot.costs.cost_model import CostModel


def specsot_part(doc: Mapping) -> dict:
    """SPECSOT's state out of any of the three shapes the benchmarks keep: a whole `/server_info`
    (`internal_states[0].specsot`), a server_state.jsonl line (`specsot`), or that state alone
    as the benchmark folders trim it (`specsot-state-*.json`, which holds `cost_model`)."""
    if "specsot" in doc:
        return doc["specsot"]
    states = doc.get("internal_states")
    if states:
        if "specsot" not in states[0]:
            raise ValueError("no internal_states[0].specsot in the server info: is it a SPECSOT server?")
        return states[0]["specsot"]
    if "cost_model" in doc:
        return dict(doc)
    raise ValueError("neither a /server_info, a server_state line nor a SPECSOT state (no internal_states, "
                     "specsot or cost_model key): pass what a SPECSOT server's /server_info returned")  # fmt: skip


def speedup_ceiling(
    cost: CostModel, bs: int, p_by_depth: Sequence[float], draft_model: bool, narrow_extend: bool = False,
    runner_up_hit: float = 0.0, max_width: int | None = None,
) -> tuple[float, int]:
    """The most speculation can gain over plain decoding for a batch of `bs` under `cost`,
    and the draft budget that gains it: (best tokens per ms / plain's, budget; 1.0 and 0
    when nothing beats plain).

    `p_by_depth[d]` is the chance a draft at depth d+1 is accepted given its parent was (as
    `DepthAcceptance` measures it); budgets run to its length. Every request drafts alike,
    and the step costs what the cost model says: a verify of `bs x (b + 1)` rows, with a
    draft model also b - 1 draft forwards (the first draft comes from the last extend) and
    its extend over the window (`narrow_extend`: over what the chain did not write, the bonus
    token and, when all b drafts are accepted, the last), against a plain step of `bs` rows
    that extends nothing (the extend is deferred). It is the limit of any budget policy on this machine at this
    acceptance, not a prediction: padding, attention under the tree mask and sampling over
    the window cost more than the matrix products the probe timed.

    With `runner_up_hit` (the share of verified runner-ups the target took, as /server_info's
    `runner_ups` counts them), drafted depths may also verify their runner-ups, up to
    `max_width` nodes a request, as many as pay (`pick_runner_ups`, the worker's own choice):
    a hit adds one token where the chain reached its parent (`runner_up_gains`), and only the
    verify is wider (the draft forwards and the extend are the chain's).
    """
    plain_rate = bs / cost.target.ms(bs)
    best, budget, reach, accepted = 1.0, 0, 1.0, 0.0
    reaches: list[float] = []
    for b, p in enumerate(p_by_depth, start=1):
        reach *= p
        accepted += reach
        reaches.append(reach)
        rows = bs * (1.0 + reach) if narrow_extend else None
        ms = cost.step_ms(bs, b + 1, draft_steps=b - 1 if draft_model else 0, draft_extend=draft_model, extend_rows=rows)
        tokens = bs * (1.0 + accepted)
        if runner_up_hit > 0 and max_width:
            gains = runner_up_gains(reaches, [runner_up_hit] * b)
            verify_ms = lambda w: cost.target.ms(bs * w)  # noqa: E731
            chosen = pick_runner_ups([gains] * bs, [b + 1] * bs, max_width, verify_ms, ms, tokens)
            tokens += bs * sum(gains[d - 1] for d in chosen[0])
            ms += verify_ms(b + 1 + len(chosen[0])) - verify_ms(b + 1)
        gain = (tokens / ms) / plain_rate
        if gain > best:
            best, budget = gain, b
    return best, budget


def measured_speedup_ceiling(
    step_ms: Mapping[tuple[int, int], float], bs: int, p_by_depth: Sequence[float]
) -> tuple[float, int] | None:
    """`speedup_ceiling` priced with the steps a server really ran instead of modelled
    forwards: (best tokens per ms / plain's, verify width), or None where plain steps of
    `bs` requests (`step_ms[bs, 1]`) were not measured.

    `step_ms[bs, w]` is the measured time of a step of `bs` requests verifying `w` rows each
    (`/server_info`'s `measured_step_ms`, "BSxW"). Each width is credited the tokens of a
    chain `w - 1` deep at `p_by_depth`, the most `w - 1` draft nodes bring at chain-like
    acceptance (a runner-up is worth less than the chain node it displaces while reach stays
    above the runner-ups' hit rate). The time is whatever the server's steps of that width
    cost, some with cheaper shapes (a shorter chain and runner-ups). Like the modelled
    ceiling it prices every step at the mean acceptance, so a policy that drafts more where
    a request's acceptance runs high (and less elsewhere) can beat it a little; unlike it,
    it holds what the probe does not time: attention under the tree mask, sampling over the
    window, the host between forwards.
    """
    plain = step_ms.get((bs, 1))
    if plain is None:
        return None
    best, width, reach, accepted = 1.0, 1, 1.0, 0.0
    for w, p in enumerate(p_by_depth, start=2):
        reach *= p
        accepted += reach
        ms = step_ms.get((bs, w))
        if ms is not None and (1.0 + accepted) * plain / ms > best:
            best, width = (1.0 + accepted) * plain / ms, w
    return best, width


def parse_step_table(info: Mapping[str, float]) -> dict[tuple[int, int], float]:
    """`/server_info`'s `measured_step_ms` ({"BSxW": ms}) as {(bs, w): ms}."""
    out = {}
    for key, ms in info.items():
        bs, sep, w = key.partition("x")
        if not (sep and bs.isdigit() and w.isdigit()):
            raise ValueError(f"measured step key {key!r} is not 'BSxW' (e.g. '4x2')")
        out[int(bs), int(w)] = float(ms)
    return out
