"""The draft model's deferred draft-extend: plain steps leave it to a backlog, caught up in
one ragged forward when the draft is next needed.

SGLang's draft-extend runs every step over the whole verify window, padding included, at the
width its CUDA graphs were captured for. Where the draft's chain is adaptive on the eager CPU
draft backend, a plain step (which drafted nothing) may leave the extend for later: a batch
that never drafts then never pays the draft's forwards. `DraftKVSlots` records which KV slots
hold the draft's KV, so a catch-up extends exactly what the draft lacks.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import torch

from sglang_specsot.costs.cost_model import CostModel
from sglang_specsot.speculative.draft_kv import DraftKVSlots, shared_backlog
from sglang_specsot.speculative.extend_backlog import (
    ExtendBacklog,
    catch_up_passes,
    deduplicated,
    passes_ms,
)
from sglang_specsot.speculative.model_draft import SoTDraftModel
from sglang_specsot.speculative.policy.planning import best_plan, drafting_near
from sglang_specsot.speculative.policy.step_policy import StepPolicy
from sglang_specsot.speculative.policy.values import StepPricing, StepView


@dataclass(frozen=True)
class CatchUpShape:
    """How the next catch-up runs: passes of at most `pass_rows` rows, each request's
    backlog less its `shared` leading positions (an earlier request extends them)."""

    pass_rows: int
    shared: list[int]


class DeferredExtend:
    """The backlog of draft-extends plain steps deferred, and the catch-ups that clear it."""

    def __init__(self, model: SoTDraftModel, cost: CostModel, backlog: ExtendBacklog, history, kv_slots: int, device, timed: bool):  # fmt: skip
        self.model = model
        self.history = history  # req -> its committed tokens and bonus token (the SoT context's)
        self.cost = cost
        self.backlog = backlog
        self.draft_kv = DraftKVSlots(kv_slots, device=device)
        self.device = device
        self.timed = timed  # the host waits for forwards: their times teach the cost model

    # -- after prefill ---------------------------------------------------------------------

    def defer_prefill(self, batch) -> None:
        """Leave the prompt's draft-extend to the backlog, like a plain step's: a request that
        never drafts then never pays the draft's prefill. Its backlog starts at its first
        position without draft KV: its new tokens, or earlier where the radix cache shared a
        prefix some deferring request left unextended."""
        self.draft_kv.mark_slots(batch.out_cache_loc, valid=False)
        req_to_token = batch.req_to_token_pool.req_to_token
        for req, row, end in zip(batch.reqs, batch.req_pool_indices.tolist(), batch.seq_lens.tolist()):
            self.backlog.start(req.rid, self.draft_kv.behind(req_to_token, row, end))

    def stale_topk(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A deferred extend's top-k (p, index): stale by design (the backlog says so), shaped
        as a real one, for FutureMap's buffers and for merging with other requests' inputs."""
        shape = (bs, self.model.topk)
        return (
            torch.zeros(shape, dtype=torch.float32, device=self.device),  # shape: (bs, topk)
            torch.zeros(shape, dtype=torch.int64, device=self.device),  # shape: (bs, topk)
        )

    def stale(self, rids: list[str]) -> bool:
        """Whether the relayed top-k is a deferred extend's placeholder (`stale_topk`)."""
        return not self.backlog.current(rids)

    # -- after verify ----------------------------------------------------------------------

    def draft_extend(self, batch, result, fed: list[list[int]] | None, policy: StepPolicy, view: StepView, pricing: StepPricing) -> str | None:  # fmt: skip
        """Extend over what the draft's KV lacks of this step, or defer it: what computed the
        next top-k ("extend" after a current backlog, "catch_up" after a deferred one), or None.

        Where the backlog was current, the tokens this step's chain fed and verify kept have
        their draft KV already: only the rest of the step is behind."""
        rids = [req.rid for req in batch.reqs]
        self.backlog.keep(rids)
        was_current = self.backlog.current(rids)
        written = _written_by_chain(result, fed) if was_current else [0] * len(rids)
        self.backlog.add(rids, [k - w for k, w in zip(result.accept_lens.tolist(), written)])
        self.backlog.reused_rows += sum(written)
        self._mark_step(batch, result, valid=True, upto=written)
        draft_input = result.next_draft_input
        if self._defer(batch, rids, policy, view, pricing):
            self.backlog.deferred_steps += 1
            self._mark_step(batch, result, valid=False, skip=written)
            draft_input.topk_p, draft_input.topk_index = self.stale_topk(len(rids))
            return None
        # One ragged extend ending where this step's tokens do: the whole backlog after plain
        # steps (a catch-up), or after a drafting step what its chain did not write.
        draft_input.topk_p, draft_input.topk_index = self.catch_up(
            batch, result.new_seq_lens, after_verify=was_current
        )
        return "extend" if was_current else "catch_up"

    def _defer(self, batch, rids: list[str], policy: StepPolicy, view: StepView, pricing: StepPricing) -> bool:  # fmt: skip
        """A plain next step (as the policy now plans it) may leave the extend for later.

        While some drafting plan is near paying, the backlog is kept short enough that the
        step which drafts again waits at most about one plain step for its catch-up. While
        none is, nothing is flushed: a flush would buy an extend that may never be needed."""
        if policy.measures_plain(len(rids)):
            # The next step runs plain to measure a plain step, which plans price as deferring.
            return self.backlog.may_defer(rids, self.catch_up_ms, math.inf)
        plans = policy.plans(policy.acceptance(view), policy.first_acceptance(view))
        best = best_plan(plans)
        if best.width > 1 and policy.setup_repaid(view, best, pricing):
            return False  # the next step drafts: extend now, where the step layout has it
        bs = len(rids)
        # Asked on every plain step: asking expires stale verdicts (DraftingRuns._fresh) as
        # they go stale, counting a stale loss toward its backoff before eviction.
        losing = policy.runs_lose(view)
        if best.width > 1 or not drafting_near(plans, best) or losing:
            return self.backlog.may_defer(rids, self.catch_up_ms, math.inf)
        limit = self.cost.draft.ms(bs) + self.cost.target.ms(bs)
        shape = self.catch_up_shape(batch)
        price = functools.partial(self.catch_up_ms, pass_rows=shape.pass_rows)
        if price(self.backlog.catch_up_rows(rids, shared=shape.shared)) > limit:
            # A prompt behind (a deferred prefill): no flush keeps the next catch-up within a
            # plain step any more, so it waits until a drafting plan repays it.
            return True
        return self.backlog.may_defer(rids, price, limit, shared=shape.shared)

    def catch_up_ms(self, rows: int, pass_rows: int | None = None) -> float:
        """A catch-up of `rows` rows in passes of at most `pass_rows` (one pass: None) as the
        cost model prices it, corrected by what catch-ups have really cost here
        (`ExtendBacklog.price_ratio`): uncorrected, the model underprices them, and drafting
        runs would begin whose catch-up they do not repay."""
        priced = passes_ms(rows, pass_rows or max(rows, 1), self.cost.draft.ms)
        return priced * self.backlog.price_ratio()

    def setup_ms(self, batch) -> float:
        """What the next drafting step must catch up first."""
        rids = [req.rid for req in batch.reqs]
        shape = self.catch_up_shape(batch)
        rows = self.backlog.catch_up_rows(rids, shared=shape.shared)
        return self.catch_up_ms(rows, shape.pass_rows) if rows else 0.0

    def catch_up_shape(self, batch) -> CatchUpShape:
        """The cheaper way, as the draft's cost prices it, to run the next catch-up: in passes
        as wide as a prefill (--chunked-prefill-size), where one pass extends a prefix its
        requests share once (SoT branches share their prompt); or in passes of the rows at
        which a draft forward costs least per row (`ForwardCost.cheapest_rows`), where rows
        cost more beyond them. On an AVX2 CPU without native bf16 the draft's int8 products
        stop at 16 rows and a bf16 row costs about as much as a forward of 16: there the
        0.5B draft's probe prices a 48-row catch-up at about 1,140 ms in one pass and 125 ms
        in three passes of 16, and a catch-up is what every exploring step pays first."""
        wide = self.backlog.max_rows
        cheapest = self.cost.draft.cheapest_rows()
        sizes = [wide] if cheapest is None or cheapest >= wide else [wide, cheapest]
        shapes = [CatchUpShape(size, shared) for size, shared in zip(sizes, self.shared(batch, sizes))]
        rids = [req.rid for req in batch.reqs]

        def price(shape: CatchUpShape) -> float:
            return self.catch_up_ms(self.backlog.catch_up_rows(rids, shared=shape.shared), shape.pass_rows)

        return min(shapes, key=price)

    def shared(self, batch, pass_sizes: list[int]) -> list[list[int]]:
        """Per pass size, per request, the leading positions of its backlog that an earlier
        request of the batch extends in the same catch-up (a prefix the radix cache shares,
        as SoT branches share their prompt), where the catch-up is one pass of at most that
        many rows; zeros where it is not, or where the draft's attention backend may let a row
        attend before a later row's KV is written. The shared slots are found once for all."""
        lags = self.backlog.lag([req.rid for req in batch.reqs])
        if sum(1 for b in lags if b > 1) < 2 or not self._extend_writes_first:
            return [[0] * len(lags) for _ in pass_sizes]
        # Committed positions: the history holds one token more (the bonus token).
        ends = [len(self.history(req)) - 1 for req in batch.reqs]
        req_to_token, pool_rows = batch.req_to_token_pool.req_to_token, batch.req_pool_indices.tolist()
        slots = shared_backlog(req_to_token, pool_rows, ends, lags)
        return [[b - d for b, d in zip(lags, deduplicated(ends, lags, slots, size))] for size in pass_sizes]

    @functools.cached_property
    def _extend_writes_first(self) -> bool:
        # Declared by the backend class (cpu/attention.py's SpecSoTCpuAttnBackend and kin).
        return getattr(self.model.draft_runner.attn_backend, "extend_writes_kv_first", False)

    def _mark_step(self, batch, result, valid: bool, skip: list[int] | None = None, upto: list[int] | None = None) -> None:
        """Record whether the draft's KV holds this step's committed tokens (positions
        [seq_lens, new_seq_lens)): of each request's, all but the first `skip`, or only the
        first `upto`."""
        starts, ends = batch.seq_lens.tolist(), result.new_seq_lens.tolist()
        if skip is not None:
            starts = [s + k for s, k in zip(starts, skip)]
        if upto is not None:
            ends = [s + u for s, u in zip(starts, upto)]
        ranges = [(s, e) for s, e in zip(starts, ends) if e > s]
        rows = [r for r, s, e in zip(batch.req_pool_indices.tolist(), starts, ends) if e > s]
        if ranges:
            self.draft_kv.mark(batch.req_to_token_pool.req_to_token, rows, ranges, valid)

    # -- catch-up --------------------------------------------------------------------------

    def catch_up(self, batch, seq_lens: torch.Tensor, after_verify: bool = False):
        """One draft-extend (or a few, see catch_up_passes) over every request's backlog up to
        `seq_lens`; the top-k after its last token. `after_verify`: the backlog is this
        step's alone (a current backlog's draft-extend), not counted as a catch-up."""
        rids = [req.rid for req in batch.reqs]
        histories = [self.history(req) for req in batch.reqs]
        ends = seq_lens.tolist()  # a host tensor: the backlog is on with CPU backends only
        assert all(len(h) == e + 1 for h, e in zip(histories, ends)), (
            f"SPECSOT: drafter history out of step with seq_lens {ends}: {[len(h) for h in histories]}"
        )
        req_to_token, pool_rows = batch.req_to_token_pool.req_to_token, batch.req_pool_indices.tolist()
        topk = None
        shape = self.catch_up_shape(batch)
        lags = [b - s for b, s in zip(self.backlog.lag(rids), shape.shared)]
        self.backlog.shared_rows += sum(shape.shared)
        for ranges in catch_up_passes(ends, lags, shape.pass_rows):
            tokens = [h[s : e + 1] for h, (s, e) in zip(histories, ranges)]
            rows = sum(e - s for s, e in ranges)
            # A catch-up pays what grows with its rows (prefill attention), which read as
            # per-forward overhead would overprice every draft forward: not observed, and
            # priced by the model's own, uncorrected, price (price_ratio is measured against it).
            priced_ms = self.cost.draft.ms(rows)
            topk, ms = self.timed_extend(rows, self.model.extend_ranges, batch, ranges, tokens, observe=after_verify)
            self.draft_kv.mark(req_to_token, pool_rows, ranges, valid=True)
            if after_verify:
                self.backlog.step_extends += 1
            else:
                self.backlog.count_catch_up(rows, ms, priced_ms)
        self.backlog.clear(rids)
        assert topk is not None, "catch-up called with no backlog"
        return topk

    def timed_extend(self, rows: int, extend, *args, observe: bool = True):
        """`extend(*args)` and its time in ms (folded into the draft's cost where `observe`)."""
        start = time.perf_counter()
        out = extend(*args)
        ms = (time.perf_counter() - start) * 1e3
        if self.timed and observe:
            self.cost.draft.observe(rows, ms)
        return out, ms


def _written_by_chain(result, fed: list[list[int]] | None) -> list[int]:
    """Per request, how many of this step's committed tokens the draft's KV holds: the
    leading tokens its chain fed that verify accepted, at most all but the bonus token
    (whose extend gives the next draft's top-k)."""
    lens = result.accept_lens.tolist()
    if fed is None:
        return [0] * len(lens)
    n = result.speculative_num_draft_tokens
    rows = result.next_token_ids.view(-1, n).tolist()  # from the root: the target's tokens
    return [leading_agreement(chain, row[: k - 1]) for chain, row, k in zip(fed, rows, lens)]


def leading_agreement(chain, committed) -> int:
    """How many leading tokens of `chain` equal `committed`'s (up to the shorter's length)."""
    agree = 0
    for drafted, kept in zip(chain, committed):
        if drafted != kept:
            break
        agree += 1
    return agree
