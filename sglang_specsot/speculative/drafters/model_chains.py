"""How a draft model's chain is shaped each step: where it stops by the draft's confidence,
which runner-ups join it, when the SoT context drafts instead, and what each teaches after
verify (the first-draft calibration, the long-match acceptance).

Functions of the drafter (`ChainDrafter`: what they read of `model.ModelDrafting`) and one
step's values; no state of their own.
"""

from __future__ import annotations

from typing import Protocol

from sglang_specsot.costs.cost_model import CostModel
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.draft_tree import (
    with_runner_ups as tree_with_runner_ups,
)
from sglang_specsot.speculative.drafters.context import ContextDrafting
from sglang_specsot.speculative.drafters.model_extend import leading_agreement
from sglang_specsot.speculative.model_draft import DraftSeams, RunnerUps
from sglang_specsot.speculative.policy.acceptance import (
    AcceptanceStats,
    FirstDraftCalibration,
    expected_drafts_accepted,
)
from sglang_specsot.speculative.policy.chains import (
    ChainStop,
    pick_runner_ups,
    runner_up_gains,
)
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.step_policy import StepPolicy
from sglang_specsot.speculative.policy.values import StepDecision

LONG_MATCH = "long_match"  # the acceptance key of long-match context chains


class ChainDrafter(Protocol):
    """What shaping a chain reads of the drafter that owns it (`model.ModelDrafting`): this
    module sits below the drafter, which calls it, so it names the drafter's parts, not its class."""

    model: DraftSeams
    context: ContextDrafting
    cost: CostModel
    config: AdaptiveConfig | None
    window: int  # verify tree nodes per request, root included
    first_calibration: FirstDraftCalibration
    long_match_stats: AcceptanceStats
    runner_up_counts: dict[str, int]  # "steps" and "verified" are counted here

    @property
    def chain_adaptive(self) -> bool: ...

    def chain_steps(self, width: int) -> int: ...


def chain_stop(d: ChainDrafter, batch, sizes: list[int], decision: StepDecision, policy: StepPolicy) -> ChainStop | None:
    """Where this step's chains may stop by the draft's confidence: an adaptive chain whose
    draft-extends keep the draft's probabilities, on a step that drafts because it pays (an
    exploring step drafts to learn). Asked after the catch-up, so the top-k it reads is current."""
    if not (d.chain_adaptive and d.model.keeps_confidence) or decision.exploring:
        return None
    if max(sizes) <= 1:
        return None
    q1 = batch.spec_info.topk_p[:, 0].tolist()
    first_q = [q if n > 1 else None for q, n in zip(q1, sizes)]
    bs = len(sizes)
    return ChainStop(
        list(decision.ps), first_q, d.first_calibration, lambda depth: policy.step_ms(bs, depth + 1),
        d.config.min_token_prob, first_ps=list(decision.firsts), max_depth=d.model.max_steps,
    )  # fmt: skip


# -- the SoT context instead of the draft model ------------------------------------------


def long_match_chains(d: ChainDrafter, batch) -> tuple[list[int] | None, ...] | None:
    """Per request, the context's likeliest chain where its recent tokens match the SoT
    context over at least `long_match` tokens (None elsewhere); None when no request does."""
    if not d.chain_adaptive or d.config.long_match == 0:
        return None
    found: list[list[int] | None] = []
    for req in batch.reqs:
        d.context.history(req)
        if d.context.context.match_length(req.rid) >= d.config.long_match:
            found.append(d.context.context.propose(req.rid, d.model.max_steps + 1).first_chain())
        else:
            found.append(None)
    return tuple(found) if any(c is not None for c in found) else None


def context_pays(d: ChainDrafter, sizes: list[int], long_match, decision: StepDecision) -> bool:
    """Whether this step drafts more tokens per ms from the context alone (no draft forwards)
    than with the draft model, at the acceptance long-match chains have measured; only when
    every request has one (the draft runs for the whole batch)."""
    plan = decision.plan
    if long_match is None or not decision.adaptive or decision.exploring or not all(long_match):
        return False
    p, bs = d.long_match_stats.p(LONG_MATCH), len(sizes)
    saved = max(0, d.chain_steps(max(sizes)) - 1) * d.cost.draft.ms(bs)
    tokens = sum(1 + expected_drafts_accepted(p, min(n - 1, len(c))) for n, c in zip(sizes, long_match))
    ms = plan.step_ms - saved
    return ms > 0 and tokens / ms > plan.rate


def observe_long_match(stats: AcceptanceStats, result, long_match) -> None:
    """How far each long-match context chain agreed with the tokens verify committed."""
    if long_match is None:
        return
    n = result.speculative_num_draft_tokens
    rows, lens = result.next_token_ids.view(-1, n).tolist(), result.accept_lens.tolist()
    with stats.one_step():
        for chain, row, k in zip(long_match, rows, lens):
            if not chain:
                continue
            agree = leading_agreement(chain, row[:k])
            # All k committed tokens agreed: what the chain says beyond them is unknown.
            stats.observe(LONG_MATCH, agree if agree == k else len(chain), agree)


# -- the draft's confidence ------------------------------------------------------------------


def note_drafts(batch, seeds: list[DraftTree | None], stop: ChainStop | None) -> tuple | None:
    """Per request, (probability, token) of each model draft of its chain, by depth (None
    where it drafted none): the first one's probability is the last extend's; deeper ones are
    known where the chain stopped by confidence."""
    if not any(seeds):
        return None
    q1 = batch.spec_info.topk_p[:, 0].tolist()
    notes = []
    for i, seed in enumerate(seeds):
        qs = [q1[i]] if stop is None else stop.qs[i]
        notes.append(None if seed is None else list(zip(qs, seed.tokens[1:])))
    return tuple(notes)


def observe_drafts(calibration: FirstDraftCalibration, result, notes) -> None:
    """Calibrate: was each draft the target's token, given the drafts before it were?"""
    if notes is None:
        return
    n = result.speculative_num_draft_tokens
    committed = result.next_token_ids.view(-1, n).tolist()  # from the root: the target's tokens
    for chain, row, k in zip(notes, committed, result.accept_lens.tolist()):
        for (q, token), target in zip(chain or [], row[:k]):
            calibration.observe(q, token == target)
            if token != target:
                break


# -- runner-ups ----------------------------------------------------------------------------


def planned_reach(seeds: list[DraftTree | None], decision: StepDecision) -> list[list[float]]:
    """Per request, the chance its chain is accepted through each depth, from the plan's
    estimates (a step without `ChainStop`: exploring)."""
    return [
        [] if seed is None else [f * p**d for d in range(seed.size - 1)]
        for seed, p, f in zip(seeds, decision.ps, decision.firsts)
    ]  # fmt: skip


def with_runner_ups(d: ChainDrafter, batch, seeds, sizes: list[int], reach: list[list[float]], policy: StepPolicy):
    """The chains with the draft's second choices beside their drafts, as many as the cost
    model says pay (`pick_runner_ups`): (seeds, sizes, the chains alone or None, the width the
    plan priced or None). The draft ran no forward for them: they cost verify rows only."""
    ups, bs = d.model.runner_ups, len(seeds)
    seconds = [_second_choices(req.rid, i, seed, ups) for i, (req, seed) in enumerate(zip(batch.reqs, seeds))]
    gains = [runner_up_gains(r, [q for _, q in second]) for r, second in zip(reach, seconds)]
    depths = [0 if seed is None else seed.size - 1 for seed in seeds]
    tokens = bs + sum(sum(r[:depth]) for r, depth in zip(reach, depths))
    width = max(sizes)
    picks = pick_runner_ups(
        gains, sizes, d.window, lambda w: d.cost.target.ms(bs * w), policy.step_ms(bs, width), tokens,
        min_gain=d.config.min_token_prob,
    )  # fmt: skip
    if not any(picks):
        return seeds, sizes, None, None
    chains = tuple(() if seed is None else seed.tokens[1:] for seed in seeds)
    out = []
    for seed, second, chosen in zip(seeds, seconds, picks):
        out.append(seed if not chosen else tree_with_runner_ups(seed, {depth: second[depth - 1][0] for depth in chosen}))
    d.runner_up_counts["steps"] += 1
    d.runner_up_counts["verified"] += sum(len(c) for c in picks)
    return out, [max(n, 1 if t is None else t.size) for n, t in zip(sizes, out)], chains, width


def _second_choices(rid: str, row: int, seed: DraftTree | None, ups: RunnerUps) -> list[tuple[int, float]]:
    """(token, the draft's probability of it) of the second choice at each depth of the chain
    `seed` (row `row` of the step's forwards), up to the first depth where it is not known:
    the extend's top two must have the chain's first draft first."""
    if seed is None or seed.size < 2:
        return []
    first = ups.first.get(rid)
    if first is None or first[0] != seed.tokens[1]:
        return []
    out = [(first[1], first[2])]
    for depth in range(2, seed.size):
        if depth - 2 >= len(ups.by_forward):
            break
        out.append(ups.by_forward[depth - 2][row])
    return out
