"""The SPECSOT worker with a draft model: the draft model's tree and the SoT context, merged.

Same step as `SpecSoTWorker` (draft -> verify -> on_publish -> draft-extend); what changes:

- draft: the draft model (`SoTDraftModel`, SGLang's standalone draft worker) proposes its
  chain or tree from the top-k its last draft-extend left in `batch.spec_info`; the SoT
  context (prompt, skeleton, siblings) fills the rest of the verify window;
- draft-extend: after the context history is updated, the draft model extends over the
  step's committed tokens and leaves the next step's top-k in `next_draft_input`, which the
  scheduler relays through `FutureMap.stash` (`SpecSoTAlgo.need_topk()` is True in this mode).

The verify window is the draft model's tree plus the context nodes of this step (at most
`--speculative-num-draft-tokens`). SGLang's draft-extend runs over that whole window, padding
included, at the width its CUDA graphs were captured for; so does this worker where it
cannot defer extends (graphs, trees, a fixed window). With the backlog (an adaptive chain on
the eager CPU draft backend) it extends only what the draft's KV lacks: committed tokens its
own chain did not feed, at least the bonus token, in one ragged forward.
"""

from __future__ import annotations

import functools
import logging
import math
import time

import torch

from sglang_specsot.costs.probe import probe_forward_cost
from sglang_specsot.host import adapter as sgl
from sglang_specsot.speculative.policy.acceptance import AcceptanceStats, expected_drafts_accepted, FirstDraftCalibration
from sglang_specsot.speculative.policy.chains import ChainStop, pick_runner_ups, runner_up_gains
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.planning import best_plan, drafting_near
from sglang_specsot.speculative.draft_tree import DraftTree, with_runner_ups
from sglang_specsot.speculative.draft_kv import DraftKVSlots, shared_backlog
from sglang_specsot.speculative.extend_backlog import ExtendBacklog, catch_up_passes, deduplicated
from sglang_specsot.speculative.inputs import SoTDraftInput
from sglang_specsot.speculative.model_draft import RunnerUps, SoTDraftModel
from sglang_specsot.speculative.worker import SpecSoTWorker

logger = logging.getLogger(__name__)

_LONG_MATCH = "long_match"  # the acceptance key of long-match context chains


class SpecSoTModelWorker(SpecSoTWorker):
    """SPECSOT drafting from a draft model and the SoT context, verified as one tree."""

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.bind_workers(target_worker, SoTDraftModel(server_args, gpu_id, nccl_port, target_worker))
        check_vocab_compatible(target_worker, self.draft_worker)
        # The draft's probability of its first token, for the budget policy (adaptive only:
        # it costs a softmax over the vocabulary per draft-extend).
        self.draft_worker.confidence = self.adaptive is not None
        # On CPU, int8 draft weights where measured faster; before the probe, which times them.
        shared = {p.data_ptr() for p in target_worker.model_runner.model.parameters()}
        self.draft_int8 = self.device_support.prepare_draft_model(self.draft_worker.draft_runner.model, shared, self.device)
        self.cost.draft = probe_forward_cost(self.draft_worker.draft_runner.model)
        # Its overhead is per layer (attention, Python), like the target's: the target's,
        # scaled by layers, is the draft's until the draft has run forwards of its own.
        self.cost.draft.prior = self.cost.target
        self.cost.draft.prior_share = _layers(self.draft_worker.draft_runner) / _layers(target_worker.model_runner)
        # What computed the top-k a step's chain starts from: SGLang's extend (after prefill
        # or verify) or a deferred extend's catch-up; acceptance by depth is split by it.
        self._topk_source = "extend"
        self.first_calibration = FirstDraftCalibration()
        # Long-match context chains: their measured acceptance, and the steps they drafted alone.
        self.long_match_stats = AcceptanceStats(self.adaptive or AdaptiveConfig.default(self.num_draft_tokens - 1))
        self.draft_model_skips = 0
        # Steps whose chains stopped by the draft's confidence, by how deep the batch drafted.
        self.chain_depths = [0] * self.draft_worker.max_steps
        self._shadow: list[list[int] | None] | None = None
        # This step's model drafts per request, (probability, token) by depth, for calibration.
        self._step_drafts: list[list[tuple[float, int]] | None] | None = None
        self._last_drafts: list[list[tuple[float, int]] | None] | None = None  # the last step's, for the step log
        self._extended = False  # whether the last step's draft-extend ran (not deferred)
        # Per request, the chain tokens this step's draft forwards fed (their KV is written).
        self._fed: list[list[int]] | None = None
        # This step's chains (their drafts, root excluded) where runner-ups joined them: what
        # a request's acceptance estimate learns is how far its chain was right.
        self._step_chains: list[tuple[int, ...]] | None = None
        self._chain_width: int | None = None  # the width the plan priced, without runner-ups
        self.runner_up_counts = {"steps": 0, "verified": 0, "accepted": 0}
        logger.info("SPECSOT cost model measured at start-up (draft, ms by rows): %s", self.cost.draft.info())
        logger.info(
            "SPECSOT drafts with %s: %d-node %s per request, up to %d SoT-context nodes more",
            sgl.get_spec().speculative_draft_model_path, self.draft_worker.tree_size,
            "chain" if self.draft_worker.topk == 1 else "tree",
            self.num_draft_tokens - self.draft_worker.tree_size,
        )  # fmt: skip

    # -- what the scheduler asks of a spec worker with a draft model ----------------------

    def alloc_memory_pool(self, **kwargs) -> None:
        # The draft model gets its own KV tensors on the shared slot ids (as STANDALONE).
        sgl.BaseSpecWorker.alloc_memory_pool(self, **kwargs)

    @property
    def last_shared_read_runner(self):
        # draft-extend, on the draft runner, is the step's last shared-buffer read
        # (base_spec_worker.py:249; as EAGLEWorkerV2.last_shared_read_runner).
        return self.draft_worker.draft_runner

    @property
    def spec_v2_attn_backends(self) -> tuple:
        dw = self.draft_worker
        extend = dw.draft_extend_attn_backend or dw.draft_runner.attn_backend
        return (self.target_worker.model_runner.attn_backend, dw.draft_attn_backend, extend)

    # -- prefill ---------------------------------------------------------------------------

    def _forward_prefill(self, batch, on_publish, pp_proxy_tensors):
        result = super()._forward_prefill(batch, on_publish, pp_proxy_tensors)
        if batch.forward_mode.is_extend() and result.next_token_ids is not None:
            if self.backlog is not None:
                self._defer_prefill(batch)
                topk_p, topk_index = self._stale_topk(len(batch.reqs))
                result.next_draft_input = SoTDraftInput(
                    bonus_tokens=result.next_token_ids, topk_p=topk_p, topk_index=topk_index
                )
            else:
                first = self.draft_worker.extend_after_prefill(batch, result.next_token_ids)
                result.next_draft_input = SoTDraftInput.from_eagle(first)
        return result

    def _defer_prefill(self, batch) -> None:
        """Leave the prompt's draft-extend to the backlog, like a plain step's: a request that
        never drafts (a batch of SoT branches, where drafting does not pay) then never pays
        the draft's prefill, and one that does pays it in its first catch-up. Its backlog
        starts at its first position without draft KV: its new tokens, or earlier where the
        radix cache shared a prefix some deferring request left unextended."""
        self.draft_kv.mark_slots(batch.out_cache_loc, valid=False)
        req_to_token = batch.req_to_token_pool.req_to_token
        for req, row, end in zip(batch.reqs, batch.req_pool_indices.tolist(), batch.seq_lens.tolist()):
            self.backlog.start(req.rid, self.draft_kv.behind(req_to_token, row, end))

    def _stale_topk(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A deferred extend's top-k (p, index): stale by design (the backlog says so), shaped
        as a real one, for FutureMap's buffers and for merging with other requests' inputs."""
        shape = (bs, self.draft_worker.topk)
        return (
            torch.zeros(shape, dtype=torch.float32, device=self.device),
            torch.zeros(shape, dtype=torch.int64, device=self.device),
        )

    # -- draft / draft-extend --------------------------------------------------------------

    def _draft_trees(self, batch, sizes: list[int]) -> list[DraftTree]:
        self._draft_source, self._step_drafts, self._fed = "context", None, None
        self._step_chains, self._chain_width = None, None
        self._takes_runner_ups  # noqa: B018 - decided at the first draft (see there)
        seeds: list[DraftTree | None] = [None] * len(sizes)
        self._shadow = self._long_match_chains(batch)
        drafts = self._chain_steps(max(sizes)) > 0
        stop = None
        if drafts and self._context_pays(sizes):
            self.draft_model_skips += 1  # the SoT context alone drafts this step
        elif drafts:
            if self._topk_stale(batch):
                # Step one reads the top-k of the draft's last extend: bring it up to date.
                batch.spec_info.topk_p, batch.spec_info.topk_index = self._catch_up(batch, batch.seq_lens)
                sizes = self._replan(batch, sizes)  # the draft's confidence is known only now
            self._draft_source = self._topk_source
            stop = self._chain_stop(batch, sizes)
            steps = self._chain_steps(max(sizes))
            if stop is not None:
                steps = self.draft_worker.max_steps if stop.go_on() else 1
            seeds = self._draft_model_trees(batch, steps, stop)
            if stop is not None:  # the chains end where the draft's confidence said
                sizes = [1 + d for d in stop.depths()]
                self.chain_depths[stop.depth - 1] += 1
        if self._chain_adaptive:
            seeds = [_chain_prefix(seed, n - 1) for seed, n in zip(seeds, sizes)]
            self._note_drafts(batch, seeds, stop)
        if self._takes_runner_ups and any(seeds):
            reach = stop.reach if stop is not None else self._planned_reach(seeds)
            seeds, sizes = self._with_runner_ups(batch, seeds, sizes, reach)
        # The model's tree goes in whole; SoT-context nodes fill the request's budget.
        return [
            self._context_tree(req, max(n, seed.size if seed else 1), seed)
            for req, seed, n in zip(batch.reqs, seeds, sizes)
        ]

    def _draft_model_trees(self, batch, steps: int, stop: ChainStop | None = None) -> list[DraftTree | None]:
        if steps == 0:
            return [None] * len(batch.reqs)
        start = time.perf_counter()
        seeds = self.draft_worker.draft_trees(batch, steps, stop)
        forwards = steps - 1 if stop is None else stop.depth - 1  # step one reads the relayed top-k
        if self.draft_worker.topk == 1:
            # Forward i fed the chain's token i+1 at its position and wrote its KV there
            # (draft_forward, eagle_worker_v2.py:808-848), as a draft-extend over it would.
            self._fed = [list(seed.tokens[1 : 1 + forwards]) if seed else [] for seed in seeds]
        if self._refresh_costs and forwards > 0:
            per_forward = (time.perf_counter() - start) * 1e3 / forwards
            self.cost.draft.observe(len(batch.reqs) * self.draft_worker.topk, per_forward)
        return seeds

    @functools.cached_property
    def _takes_runner_ups(self) -> bool:
        """Whether chains take runner-ups (`AdaptiveConfig.runner_ups`, an adaptive chain);
        asked from the first draft on, when the draft's backends exist. From then on, the
        draft model keeps its second choices (`RunnerUps`)."""
        if not (self._chain_adaptive and self.adaptive.runner_ups):
            return False
        self.draft_worker.runner_ups = RunnerUps()
        return True

    def _planned_reach(self, seeds: list[DraftTree | None]) -> list[list[float]]:
        """Per request, the chance its chain is accepted through each depth, from the
        plan's estimates (a step without `ChainStop`: exploring)."""
        return [
            [] if seed is None else [f * p**d for d in range(seed.size - 1)]
            for seed, p, f in zip(seeds, self._last_ps, self._last_firsts)
        ]  # fmt: skip

    def _with_runner_ups(
        self, batch, seeds: list[DraftTree | None], sizes: list[int], reach: list[list[float]]
    ) -> tuple[list[DraftTree | None], list[int]]:  # fmt: skip
        """The chains with the draft's second choices beside their drafts, as many as the
        cost model says pay (`pick_runner_ups`), and the trees' new sizes. `reach[i]`: the
        chance request i's chain is accepted through each depth. The draft ran no forward
        for the runner-ups: they cost verify rows only."""
        ups, bs = self.draft_worker.runner_ups, len(seeds)
        seconds = [self._second_choices(req.rid, i, seed, ups) for i, (req, seed) in enumerate(zip(batch.reqs, seeds))]
        gains = [runner_up_gains(r, [q for _, q in second]) for r, second in zip(reach, seconds)]
        depths = [0 if seed is None else seed.size - 1 for seed in seeds]
        tokens = bs + sum(sum(r[:d]) for r, d in zip(reach, depths))
        width = max(sizes)
        picks = pick_runner_ups(
            gains, sizes, self.num_draft_tokens, lambda w: self.cost.target.ms(bs * w), self._step_ms(bs, width), tokens,
            min_gain=self.adaptive.min_token_prob,
        )  # fmt: skip
        if not any(picks):
            return seeds, sizes
        self._chain_width = width
        self._step_chains = [() if seed is None else seed.tokens[1:] for seed in seeds]
        out = []
        for seed, second, chosen in zip(seeds, seconds, picks):
            out.append(seed if not chosen else with_runner_ups(seed, {d: second[d - 1][0] for d in chosen}))
        self.runner_up_counts["steps"] += 1
        self.runner_up_counts["verified"] += sum(len(c) for c in picks)
        return out, [max(n, 1 if t is None else t.size) for n, t in zip(sizes, out)]

    def _second_choices(self, rid: str, row: int, seed: DraftTree | None, ups: RunnerUps) -> list[tuple[int, float]]:
        """(token, the draft's probability of it) of the second choice at each depth of the
        chain `seed` (row `row` of the step's forwards), up to the first depth where it is not
        known: the extend's top two must have the chain's first draft first."""
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

    def _chain_stop(self, batch, sizes: list[int]) -> ChainStop | None:
        """Where the chains of this step may stop by the draft's confidence (`ChainStop`):
        an adaptive chain whose draft-extends keep the draft's probabilities, on a step that
        drafts because it pays (an exploring step drafts to learn). Asked after the catch-up,
        so the top-k it reads is current."""
        if not (self._chain_adaptive and self.draft_worker.keeps_confidence) or self._exploring:
            return None
        if max(sizes) <= 1:
            return None
        q1 = batch.spec_info.topk_p[:, 0].tolist()
        first_q = [q if n > 1 else None for q, n in zip(q1, sizes)]
        bs = len(sizes)
        return ChainStop(
            self._last_ps, first_q, self.first_calibration, lambda depth: self._step_ms(bs, depth + 1),
            self.adaptive.min_token_prob, first_ps=self._last_firsts, max_depth=self.draft_worker.max_steps,
        )  # fmt: skip

    # -- skipping the draft model where the SoT context matches long ---------------------

    def _long_match_chains(self, batch) -> list[list[int] | None] | None:
        """Per request, the context's likeliest chain where its recent tokens match the SoT
        context over at least `long_match` tokens (None elsewhere); None when no request
        does. Compared with the committed tokens after verify, whatever drafted the step."""
        if not self._chain_adaptive or self.adaptive.long_match == 0:
            return None
        chains: list[list[int] | None] = []
        for req in batch.reqs:
            self._history(req)
            if self.drafter.match_length(req.rid) >= self.adaptive.long_match:
                chains.append(self.drafter.propose(req.rid, self.draft_worker.max_steps + 1).first_chain())
            else:
                chains.append(None)
        return chains if any(c is not None for c in chains) else None

    def _context_pays(self, sizes: list[int]) -> bool:
        """Whether this step drafts more tokens per ms from the context alone (no draft
        forwards) than with the draft model, at the acceptance long-match context chains
        have measured; only when every request has one (the draft runs for the whole batch)."""
        chains, plan = self._shadow, self._last_plan
        if chains is None or plan is None or self._exploring or not all(chains):
            return False
        p, bs = self.long_match_stats.p(_LONG_MATCH), len(sizes)
        saved = max(0, self._chain_steps(max(sizes)) - 1) * self.cost.draft.ms(bs)
        tokens = sum(1 + expected_drafts_accepted(p, min(n - 1, len(c))) for n, c in zip(sizes, chains))
        ms = plan.step_ms - saved
        return ms > 0 and tokens / ms > plan.rate

    def _observe_long_match_chains(self, result) -> None:
        """How far each long-match context chain agreed with the tokens verify committed."""
        chains, self._shadow = self._shadow, None
        if chains is None:
            return
        n = result.speculative_num_draft_tokens
        rows, lens = result.next_token_ids.view(-1, n).tolist(), result.accept_lens.tolist()
        with self.long_match_stats.one_step():
            for chain, row, k in zip(chains, rows, lens):
                if not chain:
                    continue
                agree = _leading_agreement(chain, row[:k])
                # All k committed tokens agreed: what the chain says beyond them is unknown.
                self.long_match_stats.observe(_LONG_MATCH, agree if agree == k else len(chain), agree)

    # -- the draft model's confidence in its first draft ----------------------------------

    def _first_draft_acceptance(self, batch, firsts: list[float]) -> list[float]:
        """Each request's calibrated chance that the draft's first token is accepted, read
        from the top-k its last draft-extend left (no forward); the running `firsts` where
        that top-k is stale (a deferred extend) or the chain is not adaptive."""
        if not self._chain_adaptive or self._topk_stale(batch):
            return firsts
        topk_p = getattr(batch.spec_info, "topk_p", None)
        if topk_p is None or topk_p.shape[0] != len(firsts):
            return firsts
        return [self.first_calibration.rate(q, f) for q, f in zip(topk_p[:, 0].tolist(), firsts)]

    def _replan(self, batch, sizes: list[int]) -> list[int]:
        """After a catch-up: the plan again, now with the draft's confidence in its first
        token (an exploring step keeps its plan: it drafts to learn)."""
        if not self._chain_adaptive or self._exploring:
            return sizes
        plan = self._last_plan = self._decide(self._last_ps, self._first_draft_acceptance(batch, self._last_firsts))
        return [b + 1 for b in plan.budgets]

    def _note_drafts(self, batch, seeds: list[DraftTree | None], stop: ChainStop | None) -> None:
        """Per request, (probability, token) of each model draft of its chain in this step's
        verify tree, by depth (None where it drafted none), for `_observe_drafts`: the first
        one's probability is the last extend's; deeper ones are known where the chain
        stopped by confidence (`stop`)."""
        if not any(seeds):
            return
        q1 = batch.spec_info.topk_p[:, 0].tolist()
        self._step_drafts = []
        for i, seed in enumerate(seeds):
            qs = [q1[i]] if stop is None else stop.qs[i]
            self._step_drafts.append(None if seed is None else list(zip(qs, seed.tokens[1:])))

    def _observe_drafts(self, result) -> None:
        """Calibrate: was each draft the target's token, given the drafts before it were?"""
        self._last_drafts, entries, self._step_drafts = self._step_drafts, self._step_drafts, None
        if entries is None:
            return
        n = result.speculative_num_draft_tokens
        committed = result.next_token_ids.view(-1, n).tolist()  # from the root: the target's tokens
        for chain, row, k in zip(entries, committed, result.accept_lens.tolist()):
            for (q, token), target in zip(chain or [], row[:k]):
                self.first_calibration.observe(q, token == target)
                if token != target:
                    break

    def _first_draft_q(self) -> list[float] | None:
        entries = self._last_drafts
        return None if entries is None else [round(e[0][0], 4) if e else None for e in entries]

    def _topk_stale(self, batch) -> bool:
        """Whether the relayed top-k is a deferred extend's placeholder (`_stale_topk`)."""
        return self.backlog is not None and not self.backlog.current(self._rids(batch))

    @functools.cached_property
    def backlog(self) -> ExtendBacklog | None:
        """Plain steps defer the draft-extend where the draft's chain is adaptive (the CPU
        draft backend); with draft-extend CUDA graphs every step extends, as in SGLang.
        Read first at the first prefill, after the scheduler built the attention backends."""
        if not (self._chain_adaptive and self.adaptive.defer_draft_extend):
            return None
        chunk = self.server_args.chunked_prefill_size  # a catch-up pass is a prefill
        return ExtendBacklog(max_rows=chunk) if chunk and chunk > 0 else ExtendBacklog()

    @functools.cached_property
    def draft_kv(self) -> DraftKVSlots:
        """Which KV slots hold the draft's KV (kept only while extends may be deferred)."""
        pool = self.target_worker.model_runner.token_to_kv_pool
        return DraftKVSlots(pool.size + pool.page_size, device=self.device)

    @property
    def _chain_adaptive(self) -> bool:
        # Budgets shorten the draft model's chain only where it is a chain (top-k 1) and its
        # backend takes a step count per call; otherwise every step drafts the full tree.
        return self.adaptive is not None and self.draft_worker.topk == 1 and self.draft_worker.variable_steps

    def _chain_steps(self, width: int) -> int:
        """Draft-model steps of a step whose widest budget is `width - 1` tokens."""
        if not self._chain_adaptive:
            return self.draft_worker.max_steps
        return min(width - 1, self.draft_worker.max_steps)

    def _candidate_budgets(self, bs: int) -> tuple[int, ...]:
        # An adaptive chain's budget is its length: nodes beyond the chain would be SoT-context
        # guesses, which the budget model would price as chain tokens, so a wider window would
        # cost more rows for no more tokens.
        budgets = super()._candidate_budgets(bs)
        if not self._chain_adaptive:
            return budgets
        return tuple(sorted({min(b, self.draft_worker.max_steps) for b in budgets}))

    def _min_budget(self) -> int:
        # A fixed chain or tree is verified whole; an adaptive chain may be cut to nothing.
        return 0 if self._chain_adaptive else self.draft_worker.tree_size - 1

    def _catch_ups(self) -> int:
        return 0 if self.backlog is None else self.backlog.catch_ups

    def _wider_step_ms(self, bs: int, width: int) -> float | None:
        # Steps of one width differ here by what drafted them: a step whose chain stopped
        # early, or that drafted from the SoT context alone (no draft forwards), is cheaper
        # than a full chain of a narrower window. A wider step's time bounds nothing.
        return None

    def _modelled_step_ms(self, bs: int, width: int) -> float:
        # Draft-extend runs every step (the draft's KV must follow the text), except that a
        # plain step defers it when the backlog is on. The catch-up a drafting step then
        # needs first is not priced here but weighed apart: a drafting plan must repay it
        # in the steps its batch has left (SpecSoTWorker._setup_repaid).
        forwards = max(0, self._chain_steps(width) - 1)
        extend = width > 1 or self.backlog is None
        # With the backlog, a drafting step extends what its chain did not write: the bonus
        # token, and the chain's last draft when verify accepts all of it (draft_extend).
        rows = None if self.backlog is None else bs * min(width, 2)
        return self.cost.step_ms(bs, width, draft_steps=forwards, draft_extend=extend, extend_rows=rows)

    def speculative_state_report(self) -> dict:
        report = super().speculative_state_report()
        report["specsot"]["draft_int8"] = None if self.draft_int8 is None else self.draft_int8.info()
        if self.backlog is not None:
            report["specsot"]["draft_extend"] = self.backlog.info()
        if self._chain_adaptive:
            report["specsot"]["first_draft_calibration"] = self.first_calibration.info()
            report["specsot"]["chain_depths"] = list(self.chain_depths)
            if self.draft_worker.runner_ups is not None:
                report["specsot"]["runner_ups"] = dict(self.runner_up_counts)
            report["specsot"]["long_match"] = {
                "p": round(self.long_match_stats.p(_LONG_MATCH), 3), "draft_model_skips": self.draft_model_skips,
            }  # fmt: skip
        return report

    def _overheads(self) -> dict:
        return {**super()._overheads(), "draft_overhead_ms": round(self.cost.draft.current_overhead_ms(), 3)}

    def _draft_extend_counters(self) -> dict | None:
        return None if self.backlog is None else self.backlog.info()

    def draft_extend(self, batch, result) -> None:
        super().draft_extend(batch, result)  # the context history first (host side)
        self._observe_drafts(result)
        self._observe_long_match_chains(result)
        rids = self._rids(batch)
        self._extended = True  # unless deferred just below
        if self.backlog is None:
            # SGLang's own draft-extend over the verify window (as with CUDA graphs).
            self._topk_source = "extend"
            self._timed_extend(len(rids) * result.speculative_num_draft_tokens,
                               self.draft_worker.extend_after_verify, batch, result)  # fmt: skip
            return
        self.backlog.keep(rids)
        was_current = self.backlog.current(rids)
        # Where the backlog was current, the tokens this step's chain fed and verify kept
        # have their draft KV already: only the rest of the step is behind.
        written = self._written_by_chain(result) if was_current else [0] * len(rids)
        self.backlog.add(rids, [k - w for k, w in zip(result.accept_lens.tolist(), written)])
        self.backlog.reused_rows += sum(written)
        self._mark_step(batch, result, valid=True, upto=written)
        draft_input = result.next_draft_input
        if self._defer_extend(batch, rids):
            self._extended = False
            self.backlog.deferred_steps += 1
            self._mark_step(batch, result, valid=False, skip=written)
            draft_input.topk_p, draft_input.topk_index = self._stale_topk(len(rids))
            return
        # One ragged extend over what the draft's KV lacks, ending where this step's tokens
        # do: the whole backlog after plain steps (a catch-up), or after a drafting step the
        # tokens its chain did not write (at least the bonus token). SGLang's extend instead
        # runs over the whole verify window, padding included, for CUDA graphs' fixed shapes:
        # every row's forward and logits, where a step commits a token or two.
        draft_input.topk_p, draft_input.topk_index = self._catch_up(
            batch, result.new_seq_lens, after_verify=was_current
        )

    def _forget(self, rid: str) -> None:
        super()._forget(rid)
        if self.draft_worker.runner_ups is not None:
            self.draft_worker.runner_ups.forget(rid)

    def _priced_width(self, result) -> int:
        # Runner-ups widen a step's verify beyond what its plan priced, where the cost model
        # said the rows were free: its time is the time of a step of its chains' width.
        return self._chain_width or result.speculative_num_draft_tokens

    def _drafts_accepted(self, row: int, committed: list[int]) -> int:
        # With runner-ups, how far the chain itself was right: a request's acceptance
        # estimate is its chain's (what plans and ChainStop price); a runner-up verify took
        # is counted apart (`runner_up_counts`).
        if self._step_chains is None:
            return super()._drafts_accepted(row, committed)
        chain = self._step_chains[row]
        agree = _leading_agreement(chain, committed)
        if agree < min(len(chain), len(committed)):
            self.runner_up_counts["accepted"] += 1
        return agree

    def _written_by_chain(self, result) -> list[int]:
        """Per request, how many of this step's committed tokens the draft's KV holds: the
        leading tokens its chain fed (`_fed`) that verify accepted, at most all but the
        bonus token (whose extend gives the next draft's top-k)."""
        fed, self._fed = self._fed, None
        lens = result.accept_lens.tolist()
        if fed is None:
            return [0] * len(lens)
        n = result.speculative_num_draft_tokens
        rows = result.next_token_ids.view(-1, n).tolist()  # from the root: the target's tokens
        return [_leading_agreement(chain, row[: k - 1]) for chain, row, k in zip(fed, rows, lens)]

    def _defer_extend(self, batch, rids: list[str]) -> bool:
        """A plain next step (as the policy now plans it) may leave the extend for later.

        While some drafting plan is near paying, the backlog of plain steps is kept short
        enough that the step which drafts again waits at most about one plain step for its
        catch-up (a deferred prefill's backlog is longer from the start, and waits). While
        none is, nothing is flushed: a flush would buy an extend that may never be needed, so
        the backlog waits until a drafting plan repays it."""
        plans = self._candidate_plans(self._acceptance(batch.reqs), self._first_acceptance(batch.reqs))
        best = best_plan(plans)
        if best.width > 1 and self._setup_repaid(batch, best):
            return False  # the next step drafts: extend now, where the step layout has it
        bs = len(rids)
        # Asked on every plain step, not only when the terms before it do not decide: asking
        # expires stale verdicts (DraftingRuns._fresh) as they go stale, counting a stale loss
        # toward its backoff before the max_keys bound could evict it uncounted. (A finished
        # run expires its own key's verdict in DraftingRuns.step.)
        losing = self._runs_lose(batch.reqs)
        if best.width > 1 or not drafting_near(plans, best) or losing:
            # Drafting would not repay a catch-up (or runs here have measured it does not):
            # a flush would ready a run that is not coming.
            return self.backlog.may_defer(rids, self._catch_up_ms, math.inf)
        limit = self.cost.draft.ms(bs) + self.cost.target.ms(bs)
        shared = self._shared(batch)
        if self._catch_up_ms(self.backlog.catch_up_rows(rids, shared=shared)) > limit:
            # A prompt behind (a deferred prefill): no flush keeps the next catch-up within
            # a plain step any more, so it waits until a drafting plan repays it.
            return True
        return self.backlog.may_defer(rids, self._catch_up_ms, limit, shared=shared)

    def _catch_up_ms(self, rows: int) -> float:
        """A catch-up of `rows` rows as the cost model prices it, corrected by what catch-ups
        have really cost here (`ExtendBacklog.price_ratio`): the model underprices them, and
        uncorrected, drafting runs would begin whose catch-up they do not repay."""
        return self.cost.draft.ms(rows) * self.backlog.price_ratio()

    def _extended_on_plain_step(self) -> bool:
        # Read after the step's draft_extend: a plain step that did not defer flushed the
        # backlog (without one, every step extends and a plain step's time includes it).
        return self.backlog is not None and self._extended

    def _learns_from_shadows(self) -> bool:
        # The estimates here are the draft model's chains' acceptance: a SoT-context shadow
        # says nothing of them, and the model's own chain costs its forwards to propose.
        return False

    def _setup_ms(self, batch) -> float:
        # Drafting with the model needs a deferred backlog caught up first: a drafting plan
        # must repay it (_setup_repaid), and exploring counts it against explore_share, so
        # a long backlog is explored rarely.
        if self.backlog is None:
            return 0.0
        rows = self.backlog.catch_up_rows(self._rids(batch), shared=self._shared(batch))
        return self._catch_up_ms(rows) if rows else 0.0

    def _shared(self, batch) -> list[int]:
        """Per request, the leading positions of its backlog that an earlier request of the
        batch extends in the same catch-up (a prefix the radix cache shares, as SoT branches
        share their prompt: draft_kv.shared_backlog), where the catch-up is one pass; zeros
        where it is not, or where the draft's attention backend is not ours (whose extend
        writes every row's KV before any row attends: SpecSoTCpuAttnBackend.forward_extend)."""
        rids = self._rids(batch)
        lags = self.backlog.lag(rids)
        if sum(1 for b in lags if b > 1) < 2 or not self._extend_writes_first:
            return [0] * len(lags)
        # Committed positions: the drafter's history holds one token more (the bonus token),
        # at planning and after verify alike; a backlog's first position does not move.
        ends = [len(self._history(req)) - 1 for req in batch.reqs]
        req_to_token, pool_rows = batch.req_to_token_pool.req_to_token, batch.req_pool_indices.tolist()
        deduped = deduplicated(ends, lags, shared_backlog(req_to_token, pool_rows, ends, lags), self.backlog.max_rows)
        return [b - d for b, d in zip(lags, deduped)]

    @functools.cached_property
    def _extend_writes_first(self) -> bool:
        # Declared by the backend class (cpu/attention.py's SpecSoTCpuAttnBackend and its
        # subclasses); any other backend may let a row attend before a later row's KV is written.
        return getattr(self.draft_worker.draft_runner.attn_backend, "extend_writes_kv_first", False)

    def _mark_step(self, batch, result, valid: bool, skip: list[int] | None = None, upto: list[int] | None = None) -> None:
        """Record whether the draft's KV holds this step's committed tokens (positions
        [seq_lens, new_seq_lens); verify moved their KV to those slots): of each request's,
        all but the first `skip`, or only the first `upto`."""
        starts, ends = batch.seq_lens.tolist(), result.new_seq_lens.tolist()
        if skip is not None:
            starts = [s + k for s, k in zip(starts, skip)]
        if upto is not None:
            ends = [s + u for s, u in zip(starts, upto)]
        ranges = [(s, e) for s, e in zip(starts, ends) if e > s]
        rows = [r for r, s, e in zip(batch.req_pool_indices.tolist(), starts, ends) if e > s]
        if ranges:
            self.draft_kv.mark(batch.req_to_token_pool.req_to_token, rows, ranges, valid)

    def _catch_up(self, batch, seq_lens: torch.Tensor, after_verify: bool = False):
        """One draft-extend (or a few, see catch_up_passes) over every request's backlog up
        to `seq_lens` (its committed KV positions); the top-k after its last token.
        `after_verify`: the backlog is this step's alone (the draft-extend of a step whose
        backlog was current), which is not counted as a catch-up."""
        rids = self._rids(batch)
        histories = [self._history(req) for req in batch.reqs]
        ends = seq_lens.tolist()  # a host tensor: the backlog is on with CPU backends only
        # The history holds one token more than the KV: the bonus token, not yet verified.
        assert all(len(h) == e + 1 for h, e in zip(histories, ends)), (
            f"SPECSOT: drafter history out of step with seq_lens {ends}: {[len(h) for h in histories]}"
        )
        req_to_token, pool_rows = batch.req_to_token_pool.req_to_token, batch.req_pool_indices.tolist()
        topk = None
        shared = self._shared(batch)
        lags = [b - s for b, s in zip(self.backlog.lag(rids), shared)]
        self.backlog.shared_rows += sum(shared)
        for ranges in catch_up_passes(ends, lags, self.backlog.max_rows):
            tokens = [h[s : e + 1] for h, (s, e) in zip(histories, ranges)]
            extend_rows = sum(e - s for s, e in ranges)
            # A backlog's catch-up (a prompt's, or many plain steps') does not teach the draft's
            # per-forward overhead: beyond the probed products it pays what grows with its rows
            # (prefill attention), which read as overhead would overprice every draft forward
            # until no plan, not even exploring's, could pay. The model's own price,
            # uncorrected: price_ratio is measured against it.
            priced_ms = self.cost.draft.ms(extend_rows)
            topk, ms = self._timed_extend(
                extend_rows, self.draft_worker.extend_ranges, batch, ranges, tokens, observe=after_verify
            )
            self.draft_kv.mark(req_to_token, pool_rows, ranges, valid=True)
            if after_verify:
                self.backlog.step_extends += 1
            else:
                self.backlog.count_catch_up(extend_rows, ms, priced_ms)
        self.backlog.clear(rids)
        self._topk_source = "extend" if after_verify else "catch_up"
        assert topk is not None, "catch-up called with no backlog"
        return topk

    def _timed_extend(self, rows: int, extend, *args, observe: bool = True):
        """`extend(*args)` and its time in ms (folded into the draft's cost where `observe`)."""
        start = time.perf_counter()
        out = extend(*args)
        ms = (time.perf_counter() - start) * 1e3
        if self._refresh_costs and observe:
            self.cost.draft.observe(rows, ms)
        return out, ms

    @staticmethod
    def _rids(batch) -> list[str]:
        return [req.rid for req in batch.reqs]


def _leading_agreement(chain, committed) -> int:
    """How many leading tokens of `chain` equal `committed`'s (up to the shorter's length)."""
    agree = 0
    for drafted, kept in zip(chain, committed):
        if drafted != kept:
            break
        agree += 1
    return agree


def check_vocab_compatible(target_worker, draft: SoTDraftModel) -> None:
    """The draft must speak the target's token ids: same vocab size and the same mapping."""
    target_size = target_worker.model_runner.model_config.vocab_size
    draft_size = draft.draft_runner.model_config.vocab_size
    fix = "use a draft model with the target's tokenizer, or drop --speculative-draft-model-path to draft from the SoT context alone"
    if target_size != draft_size:
        raise ValueError(
            f"SPECSOT: --speculative-draft-model-path={sgl.get_spec().speculative_draft_model_path!r} has "
            f"vocab_size={draft_size}, the target has vocab_size={target_size}; {fix}"
        )
    target_tok, draft_tok = target_worker.tokenizer, draft.draft_worker.tokenizer
    if target_tok is not None and draft_tok is not None and target_tok.get_vocab() != draft_tok.get_vocab():
        raise ValueError(
            f"SPECSOT: --speculative-draft-model-path={sgl.get_spec().speculative_draft_model_path!r} "
            f"maps tokens to other ids than the target (same vocab_size {target_size}); {fix}"
        )


def _chain_prefix(seed: DraftTree | None, budget: int) -> DraftTree | None:
    """The first `budget` drafts of a chain (nodes are in chain order), or None for none."""
    if seed is None or budget <= 0:
        return None
    keep = min(seed.size, budget + 1)
    return DraftTree(seed.tokens[:keep], seed.parents[:keep])


def _layers(model_runner) -> int:
    """Transformer layers of a model runner's model (SGLang's ModelConfig.num_hidden_layers)."""
    return max(1, int(model_runner.model_config.num_hidden_layers))
