"""The SPECSOT worker on SGLang's spec-V2 schema.

One decode step reads like the algorithm:

    verify_input = self.draft(batch)                      # SoT-context token tree
    result = self.verify(batch, verify_input)             # one target forward, exact sampling
    on_publish(result.new_seq_lens)                       # fence at verify end (FutureMap)
    self.draft_extend(batch, result)                      # accepted tokens feed the drafter

There is no verify_done barrier: the next iteration's seq_lens come through the FutureMap
(`on_publish` here, `resolve_seq_lens_cpu` in the scheduler), and the next draft input
(`SoTDraftInput.bonus_tokens`) through `FutureMap.stash`. The drafter's token history is
updated by this worker itself at draft-extend, so it never depends on when the scheduler
processes results (under overlap that is one iteration later).
"""

from __future__ import annotations

import logging
import math
import os
import time

import torch

from sglang_specsot.costs import published
from sglang_specsot.costs.cost_model import CostModel, StepCostTable
from sglang_specsot.costs.probe import probe_forward_cost
from sglang_specsot.host import adapter as sgl
from sglang_specsot.speculative.policy.acceptance import ChainAcceptance, DepthAcceptance
from sglang_specsot.speculative.policy.config import AdaptiveConfig, FIXED_WINDOW_ENV
from sglang_specsot.speculative.policy.planning import best_plan, candidate_plans, explore_every, explore_plan, may_pay, StepPlan
from sglang_specsot.speculative.policy.runs import DraftingRuns, ExploreFund
from sglang_specsot.speculative import device
from sglang_specsot.speculative.context_draft import ContextDrafter
from sglang_specsot.speculative.draft_tree import DraftTree, pad_tree, tree_mask
from sglang_specsot.speculative.inputs import SoTDraftExtendInput, SoTDraftInput, SoTVerifyInput
from sglang_specsot.speculative.memory import PythonTrace, memory_report
from sglang_specsot.speculative.shadow import ShadowDrafts
from sglang_specsot.speculative.step_log import StepLog, StepRecord
from sglang_specsot.sot.tag import PLAIN_TAG, SoTTag

logger = logging.getLogger(__name__)
_MAX_WARNED = 32  # distinct malformed-tag warnings logged; later ones are not
_LAST_WARNING = f" (the last of {_MAX_WARNED} such warnings; further malformed tags are ignored silently)"


def runs_key(size: int, roles: str) -> str:
    """DraftingRuns' key for a batch of `size` requests with these SoT roles ("5 branch")."""
    return f"{size} {roles}"


class SpecSoTWorker(sgl.SpecWorkerBase):
    """Speculative worker whose drafts come from the SoT context (prompt, skeleton, siblings)."""

    # What the device's package gives this worker (speculative/device.py): set in __init__;
    # nothing for a worker built without it.
    device_support: device.DeviceSupport = device.NO_DEVICE_SUPPORT

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker):
        super().__init__()
        self.server_args = server_args
        self.device_support = device.provided()
        self.bind_workers(target_worker)  # no draft model: BaseSpecWorker's defaults then skip it
        self.model_runner = target_worker.model_runner
        self.device = sgl.get_device().device
        self.num_draft_tokens: int = sgl.get_spec().speculative_num_draft_tokens
        self.drafter = ContextDrafter()
        self._tags: dict[str, SoTTag] = {}
        self._decode_rids: set[str] = set()
        # Requests prefilled but not yet seen decoding. One that ends at prefill (a prefix
        # commit's max_new_tokens=0, a one-token answer, EOS first) never reaches
        # draft_extend, which forgets the others: it is forgotten once SGLang marks it finished.
        self._awaiting_decode: dict[str, object] = {}
        self._warned: set[str] = set()
        self._loop_logged = False
        # The cost model is measured on every start-up (and shown in /server_info); the
        # budget policy uses it unless SGLANG_SPECSOT_FIXED_WINDOW=1.
        self.cost = CostModel(target=probe_forward_cost(self.model_runner.model))
        published.publish(self.cost.target)  # the server's curve in /server_info, for SoT's routing
        self.step_costs = StepCostTable()  # real step times, where the model prices them wrong
        # Wall-clock step times mean something only where the host waits for the forward.
        self._refresh_costs = torch.device(self.device).type == "cpu"
        self.adaptive = adaptive_config(server_args, self.num_draft_tokens - 1)
        self.stats = ChainAcceptance(self.adaptive or AdaptiveConfig.default(self.num_draft_tokens - 1))
        self.shadows = ShadowDrafts()  # SoT-context trees proposed on plain steps, walked for free
        self._step_trees: tuple[DraftTree, ...] = ()
        self._last_plan: StepPlan | None = None
        self._plain_steps = 0  # plain steps since the last drafted one (for exploring)
        self._explored = 0
        self._hopeless = 0  # exploring steps skipped: drafting could not pay even at explore_p
        self._unrepaid = 0  # drafting plans turned plain: their setup would not be repaid in time
        self.drafting_runs = DraftingRuns()  # how long drafting lasts once begun, and what it saves
        self._step_tokens = 0  # tokens the last step committed
        self.explore_fund = ExploreFund(self.stats.config.explore_share)  # exploring spends what drafting saved
        self._steps = 0
        # Where each step's first draft token came from (the model worker's catch-ups differ).
        self._draft_source = "context"
        self.by_depth: dict[str, DepthAcceptance] = {}
        self._last_ps: list[float] | None = None  # each request's `stats.p` at the last plan
        self._last_firsts: list[float] | None = None  # and its `stats.first`
        self._last_candidates: dict[str, list[float]] | None = None
        self._exploring = False  # this step drafts to learn, not because it pays
        self._step_log = StepLog.from_env()  # SGLANG_SPECSOT_STEP_LOG: one JSON line per step
        self._trace = PythonTrace.from_env()  # SGLANG_SPECSOT_TRACEMALLOC: a leak hunt's tracing
        logger.info("SPECSOT cost model measured at start-up (target, ms by rows): %s", self.cost.info())

    # -- what the scheduler asks of every spec worker -------------------------------------

    def alloc_memory_pool(self, **kwargs) -> None:
        # The target's pools exist by now (scheduler.py:1098-1111); we own no KV of our own.
        self.req_to_token_pool, self.token_to_kv_pool_allocator = self.target_worker.get_memory_pool()

    def clear_cache_pool(self) -> None:
        self.drafter = ContextDrafter(self.drafter.config)
        self._tags.clear()
        self._decode_rids.clear()
        self._awaiting_decode.clear()
        self.shadows.clear()
        # The groups are gone with the cache; what drafting earns here is kept (as the step
        # costs and the drafting runs are): reset, every flush (a benchmark's between
        # requests) would make the server cold again, exploring each role anew behind a catch-up.
        self.stats.forget_groups()

    def speculative_state_report(self) -> dict:
        """What /server_info shows of SPECSOT (host change server-info-specsot)."""
        plan = self._last_plan
        return {"specsot": {
            "cost_model": self.cost.info(),
            "measured_step_ms": self.step_costs.info(),
            "adaptive": self.adaptive is not None,
            "budget_mode": FIXED if self.adaptive is None else ADAPTIVE,
            "acceptance_p": dict(list(self.stats.info().items())[-32:]),  # newest groups: first, p
            "acceptance_prior_by_role": self.stats.priors(),
            "last_plan": None if plan is None else {"width": plan.width, "budgets": list(plan.budgets)},
            "exploring_steps": self._explored,
            "exploring_skipped": self._hopeless,
            "explore_fund": self.explore_fund.info(),
            "shadow_drafts": self.shadows.proposed,
            "drafting_not_repaid": self._unrepaid,
            "drafting_runs": self.drafting_runs.info(),
            "drafting_runs_total": self.drafting_runs.totals(),
            "acceptance_by_depth": {source: d.info() for source, d in self.by_depth.items()},
            "memory": memory_report(self.drafter, self._trace),
            "omp_spin": self.device_support.thread_report(),
        }}  # fmt: skip

    def forward_batch_generation(
        self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None
    ):
        self._log_event_loop(on_publish)
        self._forget_finished_at_prefill()
        if not batch.forward_mode.is_decode():
            return self._forward_prefill(batch, on_publish, pp_proxy_tensors)
        start, explored, catch_ups = time.perf_counter(), self._explored, self._catch_ups()
        verify_input = self.draft(batch)
        drafted = time.perf_counter()
        result = self.verify(batch, verify_input, pp_proxy_tensors)
        if on_publish is not None:
            on_publish(result.new_seq_lens)  # before draft-extend: the fence is at verify end
        verified = time.perf_counter()
        self.draft_extend(batch, result)
        end = time.perf_counter()
        ms = (end - start) * 1e3
        if self.adaptive is not None:
            drafts = verify_input.draft_token_num > 1  # (`drafted` is the draft phase's end time)
            # Measured only where the host waits for the forward (as step_costs): on a GPU
            # under overlap a step's wall-clock is its launches, and nothing is measured
            # (no verdicts; the fund stays at 0 and exploring keeps its schedule).
            saved = self._saved_ms(len(batch.reqs), ms, drafts) if self._refresh_costs else 0.0
            self.drafting_runs.step(self._runs_key(batch.reqs), drafts, self._exploring, saved)
            if self.drafting_runs.exploring_run:
                self.explore_fund.charge(saved)
            else:
                self.explore_fund.earn(saved)
        width = self._priced_width(result)
        if self._measures_step_cost(catch_ups, width):
            self.step_costs.observe(len(batch.reqs), width, ms)
        if self._step_log is not None:
            phases = {"draft": drafted - start, "verify": verified - drafted, "draft_extend": end - verified}
            phases = {k: round(v * 1e3, 3) for k, v in phases.items()} | {"target_forward": round(self._target_ms, 3)}
            self._step_log.write(self._step_record(result, ms, self._explored > explored, phases))
        return result

    def _catch_ups(self) -> int:
        return 0  # deferred draft-extends' catch-ups so far (a draft model's)

    def _priced_width(self, result) -> int:
        """The verify width the step's plan priced, under which its time is kept."""
        return result.speculative_num_draft_tokens

    def _measures_step_cost(self, catch_ups_before: int, width: int) -> bool:
        """Whether this step's time is what a step of its batch size and width costs: not
        where a catch-up ran (owed whatever the step is), nor a plain step that flushed the
        backlog (plans price a plain step as deferring its extend). A flush counted as a plain
        step would overprice plain steps, and every drafting step would then look like a
        saving (DraftingRuns, ExploreFund)."""
        if not self._refresh_costs or self._catch_ups() != catch_ups_before:
            return False
        return width > 1 or not self._extended_on_plain_step()

    def _saved_ms(self, bs: int, ms: float, drafted: bool) -> float:
        """What this step saved against plain decoding (DraftingRuns): a drafting step's
        committed tokens at a plain step's time per token, less its time; a plain step that
        extended the draft (a flush, readying the next run) its time beyond a plain step's;
        any other plain step nothing (its time is plain decoding's, noise aside)."""
        plain_ms = self._step_ms(bs, 1)
        if drafted:
            return self._step_tokens * plain_ms / bs - ms
        return min(0.0, plain_ms - ms) if self._extended_on_plain_step() else 0.0

    def _extended_on_plain_step(self) -> bool:
        return False  # without a draft model nothing is extended

    def _step_record(self, result, ms: float, explored: bool, phase_ms: dict) -> StepRecord:
        plan, trees = self._last_plan if self.adaptive is not None else None, self._step_trees
        accepted = [min(k - 1, t.height) for k, t in zip(result.accept_lens.tolist(), trees)]
        return StepRecord(
            step=self._steps, bs=len(trees), ps=None if plan is None else [round(p, 4) for p in self._last_ps],
            firsts=None if plan is None else [round(p, 4) for p in self._last_firsts],
            width=result.speculative_num_draft_tokens,
            budgets=[t.size - 1 for t in trees] if plan is None else list(plan.budgets),
            drafted=[t.size - 1 for t in trees], accepted=accepted,
            expected_tokens=None if plan is None else round(plan.expected_tokens, 4),
            expected_ms=None if plan is None else round(plan.step_ms, 3),
            explored=explored, draft_source=self._draft_source, step_ms=round(ms, 3),
            candidates=None if plan is None else self._last_candidates,
            first_draft_q=self._first_draft_q(),
            cost=self._overheads(), draft_extend=self._draft_extend_counters(), phase_ms=phase_ms,
        )  # fmt: skip

    def _overheads(self) -> dict:
        return {"target_overhead_ms": round(self.cost.target.overhead_ms, 3)}

    def _draft_extend_counters(self) -> dict | None:
        return None  # no draft model, no draft-extend

    def _first_draft_q(self) -> list[float] | None:
        return None  # the draft model's confidence in its first token, where it drafted

    def _log_event_loop(self, on_publish) -> None:
        # Only the overlap event loop passes on_publish (scheduler.py:4690); the sync loop
        # does not (:4827). Logged once, so users and tests can see which loop drives us.
        if not self._loop_logged:
            self._loop_logged = True
            loop = "overlap (event_loop_overlap)" if on_publish is not None else "synchronous"
            logger.info("SPECSOT worker driven by the %s scheduler loop", loop)

    # -- prefill ---------------------------------------------------------------------------

    def _forward_prefill(self, batch, on_publish, pp_proxy_tensors):
        result = self.target_worker.forward_batch_generation(batch, pp_proxy_tensors=pp_proxy_tensors)
        # Spec-V2 convention: seq_lens is the length before this iteration's sampled token.
        result.new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        if batch.forward_mode.is_extend() and result.next_token_ids is not None:
            self._start_requests(batch, result.next_token_ids)
            result.next_draft_input = SoTDraftInput.from_bonus(result.next_token_ids)
        return result

    def _start_requests(self, batch, sampled: torch.Tensor) -> None:
        for req, token in zip(batch.reqs, sampled.tolist()):
            if getattr(req, "is_chunked", 0) > 0:
                continue  # a middle chunk's sample is discarded by the scheduler
            self._restart(req, [token])
            self._awaiting_decode[req.rid] = req

    def _forget_finished_at_prefill(self) -> None:
        # The scheduler sets a request's finish after its forward's results are processed
        # (an iteration later under overlap), so each step looks at the ones still waiting.
        for rid, req in list(self._awaiting_decode.items()):
            if req.finished():
                del self._awaiting_decode[rid]
                self._forget(rid)

    def _forget(self, rid: str) -> None:
        self.drafter.forget(rid)
        self.stats.forget(rid)  # a group's estimate outlives its members
        self._tags.pop(rid, None)
        self.shadows.forget(rid)

    def _restart(self, req, extra_tokens: list[int]) -> None:
        """(Re)start the drafter's history of `req`: its committed tokens plus `extra_tokens`."""
        tag = self._read_tag(req)
        history = list(req.origin_input_ids_unpadded) + list(req.output_ids) + extra_tokens
        self.drafter.start(req.rid, history, group=tag.group)
        self.shadows.forget(req.rid)  # its walks followed the old history

    def _read_tag(self, req) -> SoTTag:
        tag, problem = SoTTag.parse(getattr(req.sampling_params, "custom_params", None))
        if problem is not None and problem not in self._warned and len(self._warned) < _MAX_WARNED:
            # The problem text quotes the client's values, so the set of distinct ones is the
            # client's to grow: bounded, or any /generate client could grow this process.
            self._warned.add(problem)
            logger.warning("SPECSOT: ignoring malformed SoT metadata (%s); drafting from the request alone%s",
                           problem, _LAST_WARNING if len(self._warned) == _MAX_WARNED else "")  # fmt: skip
        self._tags[req.rid] = tag
        return tag

    # -- draft -----------------------------------------------------------------------------

    def draft(self, batch) -> SoTVerifyInput:
        """One verify tree per request, all padded to one width (the verify window)."""
        sizes = self._tree_sizes(batch)
        trees = self._draft_trees(batch, sizes)
        if max(sizes) == 1 and self._learns_from_shadows():
            self._propose_shadows(batch)
        self._step_trees = tuple(trees)
        n = self._verify_width(trees)
        return self._verify_input(batch, [pad_tree(t, n, filler=t.tokens[0]) for t in trees])

    def _tree_sizes(self, batch) -> list[int]:
        """Nodes (incl. the root) each request may draft this step: what the budget policy
        finds pays on this machine (the full window with SGLANG_SPECSOT_FIXED_WINDOW=1)."""
        if self.adaptive is None:
            return [self.num_draft_tokens] * len(batch.reqs)
        ps = self._last_ps = self._acceptance(batch.reqs)
        firsts = self._last_firsts = self._first_acceptance(batch.reqs)
        plan = self._decide(ps, self._first_draft_acceptance(batch, firsts))
        self._exploring = False
        if plan.width > 1 and not self._setup_repaid(batch, plan):
            self._unrepaid += 1
            plan = self._plain_plan(len(ps))
        if plan.width == 1:
            plan = self._maybe_explore(batch, ps, plan)
        else:
            self._plain_steps = 0
        self._last_plan = plan
        return [b + 1 for b in plan.budgets]

    def _maybe_explore(self, batch, ps: list[float], plain: StepPlan) -> StepPlan:
        """The plain `plain`, or once every `explore_every` plain steps a step that drafts the
        smallest budget: the acceptance estimates learn only from drafted steps, or from
        shadow drafts where those are free (then a batch never explores)."""
        if self._learns_from_shadows():
            return plain
        cold = self._cold(batch)
        if not cold and self.adaptive.explore_p is not None and not self.explore_fund.allows():
            # Exploring has spent more than drafting earned (ExploreFund). Asked first: the
            # schedule's pricing (a backlog's catch-up over req_to_token) is host time on
            # every plain step, and while unfunded the schedule does not advance.
            self.explore_fund.unfunded += 1
            return plain
        explore = explore_plan(ps, self._candidate_budgets(len(ps)), self._step_ms)
        explore_ms = explore.step_ms + self._setup_ms(batch)
        every = explore_every(plain.step_ms, explore_ms, self.adaptive.explore_share)
        self._plain_steps += 1
        if every == 0 or explore.width == 1:
            return plain
        if self._plain_steps < every and not cold:
            return plain
        self._plain_steps = 0
        if not self._worth_exploring(len(ps)):
            self._hopeless += 1
            return plain
        self._explored += 1
        self._exploring = True
        return explore

    def _cold(self, batch) -> bool:
        """Whether to explore now, off schedule and funded or not (ExploreFund): the server
        has verified drafts of some request's role on fewer than `cold_verifies` steps, so it
        knows too little of how such text accepts drafts and plans from another role's
        acceptance, the blind prior (0.5) or a step or two, where drafting seldom pays; it
        would decode plain until the schedule's turn, or never while exploring is unfunded.
        What these steps learn sets the later plans of that role: at most `cold_verifies` per
        role (plain, skeleton, branch) in a server's life. Not where drafting could not pay
        even at `explore_p`."""
        need = self.adaptive.cold_verifies
        unknown = any(self.stats.verifies(self._role(req.rid)) < need for req in batch.reqs)
        return unknown and self._worth_exploring(len(batch.reqs))

    def _worth_exploring(self, bs: int) -> bool:
        """Whether drafting could pay for this batch size at the acceptance exploring hopes
        for (`explore_p`), by more than exploring costs (`explore_share`): else what exploring
        learns could never change a plan. Priced as plans are, measured where measured."""
        c = self.adaptive
        if c.explore_p is None:
            return True  # exploring on schedule, asked for
        return may_pay(self._candidate_plans([c.explore_p] * bs, None), c.explore_share)

    def _learns_from_shadows(self) -> bool:
        """Whether plain steps propose shadow drafts (`shadow.py`): where the drafts come from
        the SoT context alone they cost no forward, so the estimates learn without exploring."""
        return self.adaptive is not None

    def _propose_shadows(self, batch) -> None:
        """The tree each request would have verified at the widest candidate budget, kept to
        be walked by the tokens the target commits (draft_extend)."""
        nodes = 1 + max(self._candidate_budgets(len(batch.reqs)))
        if nodes <= 1:
            return
        for req in batch.reqs:
            self.shadows.add(req.rid, self.drafter.propose(req.rid, nodes))

    def _observe_shadows(self, rid: str, tokens: list[int]) -> None:
        for height, accepted in self.shadows.advance(rid, tokens):
            self._observe(rid, "shadow", height, accepted)

    def _setup_ms(self, batch) -> float:
        """What the next drafting step costs before it drafts, beyond its plan's step time."""
        return 0.0  # the SoT context is always current

    def _plain_plan(self, bs: int) -> StepPlan:
        return StepPlan(1, (0,) * bs, float(bs), self._step_ms(bs, 1))

    def _setup_repaid(self, batch, plan: StepPlan) -> bool:
        """Whether drafting as `plan` does saves more than the setup it needs first
        (`_setup_ms`: a deferred draft-extend's catch-up) in the steps it will draft: as many
        as the batch has left, or fewer where drafting runs begun at a batch of this size and
        these roles (`_runs_key`) have measured shorter (`DraftingRuns`); never where the runs
        measured there saved nothing on average, setup included (`_runs_lose`). A
        catch-up after a long run of plain steps costs one draft row per token behind, which
        can be more than a few drafting steps save."""
        setup = self._setup_ms(batch)
        if setup <= 0.0:
            return True
        bs, key = len(batch.reqs), self._runs_key(batch.reqs)
        if self._runs_lose(batch.reqs):
            return False  # the runs begun here lately cost more than they saved, setup included
        plain = self._plain_plan(bs)
        saved = plan.expected_tokens / plain.rate - plan.step_ms  # ms a step saves against plain
        horizon = steps_left(batch.reqs, plan.expected_tokens / bs)
        runs = self.drafting_runs.expected(key)
        if runs is not None:
            horizon = min(horizon, runs)
        return saved > 0.0 and saved * horizon > setup

    def _runs_key(self, reqs) -> str:
        """The batch as DraftingRuns keys its runs: its size and the SoT roles in it, e.g.
        "1 skeleton", "5 branch", "2 plain+skeleton" (a request without a tag is plain)."""
        return runs_key(len(reqs), self._roles(reqs))

    def _roles(self, reqs) -> str:
        return "+".join(sorted({self._role(req.rid) for req in reqs}))

    def _runs_lose(self, reqs) -> bool:
        """Whether drafting runs begun at this batch have measured a loss, setup included
        (`DraftingRuns.pays`): at its own key or, until that has a verdict, at the largest
        smaller batch of the same roles that has one.

        A draft gains less the more rows a plain step already fills, on a CPU as on a GPU
        (see docs/benchmarks.md), so runs that lose at 3 branches lose at 4; without this
        each batch size would learn it alone, through losing runs behind catch-ups. Not the
        other way: a batch shrinks as its branches finish, and fewer rows may pay where more
        did not. A smaller batch's paying verdict says nothing of a larger one either, and
        ends the search."""
        roles = self._roles(reqs)
        for size in range(len(reqs), 0, -1):
            verdict = self.drafting_runs.pays(runs_key(size, roles))
            if verdict is not None:
                return not verdict
        return False

    def _role(self, rid: str) -> str:
        return self._tags.get(rid, PLAIN_TAG).role

    def _acceptance(self, reqs) -> list[float]:
        """Each request's chance a draft is accepted given its parent was (`ChainAcceptance.p`:
        its SoT group's estimate; a new group's from its role's)."""
        return [self.stats.p(self._stats_key(req.rid), self._role(req.rid)) for req in reqs]

    def _first_acceptance(self, reqs) -> list[float]:
        """Each request's running acceptance of its first draft (`ChainAcceptance.first`)."""
        return [self.stats.first(self._stats_key(req.rid), self._role(req.rid)) for req in reqs]

    def _first_draft_acceptance(self, batch, firsts: list[float]) -> list[float]:
        """Each request's chance its first draft is accepted, from its running acceptance
        `firsts` and, where a drafter knows better before drafting, its own confidence (the
        draft model's). SoT-context drafts carry no confidence of their own."""
        return firsts

    def _plan(self, ps: list[float], firsts: list[float] | None = None) -> StepPlan:
        """The budget policy's plan for a step of requests with acceptance `ps` (not with
        SGLANG_SPECSOT_FIXED_WINDOW=1)."""
        return best_plan(self._candidate_plans(ps, firsts))

    def _decide(self, ps: list[float], firsts: list[float] | None) -> StepPlan:
        """`_plan` for the step being drafted; with the step log on, what it weighed is kept
        (each candidate width's expected tokens and ms, before this step's timings)."""
        plans = self._candidate_plans(ps, firsts)
        if self._step_log is not None:
            self._last_candidates = {str(p.width): [round(p.expected_tokens, 4), round(p.step_ms, 3)] for p in plans}
        return best_plan(plans)

    def _candidate_plans(self, ps: list[float], firsts: list[float] | None) -> list[StepPlan]:
        return candidate_plans(
            ps, self._candidate_budgets(len(ps)), self._step_ms, self.adaptive.min_token_prob, self._min_budget(),
            firsts,
        )  # fmt: skip

    def _step_ms(self, bs: int, width: int) -> float:
        """What a step costs: as measured lately where known, else as the cost model prices
        it; never more than a wider step measured at this batch size (`_wider_step_ms`)."""
        measured = self.step_costs.ms(bs, width)
        ms = measured if measured is not None else self._modelled_step_ms(bs, width)
        wider = self._wider_step_ms(bs, width)
        return ms if wider is None else min(ms, wider)

    def _wider_step_ms(self, bs: int, width: int) -> float | None:
        """What bounds a step's cost from above: the cheapest wider step measured at this
        batch size. A SoT-context step's window is verify rows and nothing else, so a
        narrower one costs no more. Measured times are lower medians of 16 steps and noisy:
        a width whose noise priced it above a wider one would not be chosen again, and so
        never be measured again."""
        return self.step_costs.wider_ms(bs, width)

    def _modelled_step_ms(self, bs: int, width: int) -> float:
        return self.cost.step_ms(bs, width)

    def _candidate_budgets(self, bs: int) -> tuple[int, ...]:
        """The budgets the policy weighs for a batch of `bs` (the adaptive config's)."""
        return self.adaptive.candidates(bs)

    def _min_budget(self) -> int:
        return 0  # context drafting may always fall back to a plain decode

    def _stats_key(self, rid: str) -> str:
        # Branches of one SoT answer write alike: they share one acceptance estimate.
        tag = self._tags.get(rid)
        return tag.group if tag is not None and tag.group is not None else rid

    def _draft_trees(self, batch, sizes: list[int]) -> list[DraftTree]:
        return [self._context_tree(req, n) for req, n in zip(batch.reqs, sizes)]

    def _verify_width(self, trees: list[DraftTree]) -> int:
        # The widest tree of the step, at most `num_draft_tokens`: when the context offers
        # no draft for any request, the verify forward is a one-token decode, so SPECSOT
        # costs about what plain decoding costs where the context does not help.
        return max(t.size for t in trees)

    def _context_tree(self, req, n: int, seed: DraftTree | None = None) -> DraftTree:
        self._history(req)
        return self.drafter.propose(req.rid, n, seed=seed)

    def _history(self, req) -> list[int]:
        """The drafter's token history of `req`: its committed tokens and the bonus token."""
        if not self.drafter.has(req.rid):
            # A request the worker never saw prefill (e.g. the worker's caches were
            # cleared): restart from the committed tokens; the last one is the root.
            self._restart(req, [])
        return self.drafter.tokens(req.rid)

    def _verify_input(self, batch, trees: list[DraftTree]) -> SoTVerifyInput:
        """SGLang's verify input for equal-size host trees (links rebuilt from the mask)."""
        n, bs = trees[0].size, len(trees)
        mask = torch.tensor([tree_mask(t, n) for t in trees], dtype=torch.bool).flatten()
        tokens = torch.tensor([tok for t in trees for tok in t.tokens], dtype=torch.int64)
        positions = torch.empty(bs * n, dtype=torch.int64)
        links = [torch.full((bs, n), -1, dtype=torch.int64) for _ in range(3)]
        mask, tokens, positions = (x.to(self.device) for x in (mask, tokens, positions))
        links = [x.to(self.device) for x in links]
        sgl.reconstruct_indices_from_tree_mask_func(mask, batch.seq_lens, positions, *links, bs, n)
        return SoTVerifyInput(
            draft_token=tokens, custom_mask=mask, positions=positions,
            retrieve_index=links[0], retrieve_next_token=links[1], retrieve_next_sibling=links[2],
            retrieve_cum_len=None, spec_steps=n - 1, topk=1, draft_token_num=n,
            capture_hidden_mode=sgl.CaptureHiddenMode.NULL, seq_lens_sum=None, seq_lens_cpu=None,
            sot_tags=tuple(self._tags.get(r.rid, PLAIN_TAG) for r in batch.reqs), tree_depth=n,
            host_trees=tuple(trees),
        )  # fmt: skip

    # -- verify ----------------------------------------------------------------------------

    def verify(self, batch, verify_input: SoTVerifyInput, pp_proxy_tensors=None):
        """One TARGET_VERIFY forward over every tree, then SGLang's exact tree sampling."""
        n, bs = verify_input.draft_token_num, len(batch.reqs)
        fwd_stream = torch.get_device_module(self.device).current_stream()
        sgl.record_stream_for_v2_verify(batch, None, fwd_stream)
        batch.forward_mode = sgl.ForwardMode.TARGET_VERIFY
        batch.input_ids = verify_input.draft_token
        batch.out_cache_loc = sgl.assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=batch.req_to_token_pool.req_to_token,
            start_offset=batch.seq_lens, end_offset=batch.seq_lens + n,
            batch_size=bs, draft_token_num=n, device=self.device,
        )  # fmt: skip
        sgl.prepare_mamba_track_for_verify(batch)
        batch.spec_info = verify_input
        start = time.perf_counter()
        target = self.target_worker.forward_batch_generation(batch, pp_proxy_tensors=pp_proxy_tensors, is_verify=True)
        self._target_ms = (time.perf_counter() - start) * 1e3
        if self._refresh_costs:
            self.cost.target.observe(bs * n, self._target_ms)
        logits_output = target.logits_output
        if batch.sampling_info.has_custom_logit_processor:
            # SGLang's EAGLE verify skips custom processors; here each tree node's row gets
            # its request's processor, seeing the history up to that node (the drafter's
            # history is current even when the scheduler's output_ids lag under overlap).
            from sglang_specsot.speculative.verify_processors import apply_verify_processors

            histories = [self.drafter.tokens(req.rid) for req in batch.reqs]
            apply_verify_processors(
                logits_output.next_token_logits, batch.sampling_info, batch.reqs,
                verify_input.host_trees, histories,
            )  # fmt: skip
        grammar_mask = self._grammar_mask(batch, verify_input) if batch.has_grammar else None
        predict, accept_lens, accept_index = sgl.eagle_sample(
            verify_input, batch, logits_output, grammar_mask,
            watermark_state=self.model_runner.watermark_state,
        )  # fmt: skip
        new_seq_lens = batch.seq_lens + accept_lens
        sgl.commit_mamba_states_after_verify(self.target_worker, batch, accept_lens, accept_index, n)
        accept_tokens = predict[accept_index]  # (bs, n); rows past accept_lens are garbage
        sgl.move_accept_tokens_to_target_kvcache(batch, accept_index, accept_lens - 1, self.token_to_kv_pool_allocator)
        if batch.return_logprob:
            sgl.compute_spec_logprobs(batch, logits_output, predict, accept_index=accept_index)
        batch.forward_mode = sgl.ForwardMode.DECODE
        rows = torch.arange(bs, device=accept_lens.device)
        bonus = accept_tokens[rows, accept_lens.long() - 1]
        return sgl.GenerationBatchResult(
            logits_output=logits_output, next_token_ids=accept_tokens.flatten(),
            can_run_cuda_graph=target.can_run_cuda_graph, accept_lens=accept_lens,
            new_seq_lens=new_seq_lens, next_draft_input=SoTDraftInput.from_bonus(bonus),
            speculative_num_draft_tokens=n,  # this step's row stride of next_token_ids
            # Draft tokens really proposed per request (padding excluded); SGLang sums them
            # into meta_info["spec_cap_length"] (draft tokens per verify).
            cap_lens=torch.tensor([t.size - 1 for t in verify_input.host_trees], dtype=torch.int32),
        )  # fmt: skip

    def _grammar_mask(self, batch, verify_input: SoTVerifyInput):
        # Built from the host trees: no device readback, and constrained requests stay
        # constrained for every drafted token (spec_utils.build_grammar_vocab_mask).
        next_token, next_sibling = _host_links(verify_input.host_trees, verify_input.draft_token_num)
        tree = sgl.GrammarTree.from_host(
            next_token, next_sibling, verify_input.draft_token.cpu().view(len(batch.reqs), -1)
        )
        return sgl.build_grammar_vocab_mask(
            reqs=batch.reqs, tree=tree, sampling_info=batch.sampling_info,
            device=verify_input.retrieve_next_token.device, barrier=None,
        )  # fmt: skip

    # -- draft-extend ----------------------------------------------------------------------

    def draft_extend(self, batch, result) -> None:
        """Feed each request's accepted tokens to the drafter (and so to its SoT siblings)."""
        n = result.speculative_num_draft_tokens
        extend = SoTDraftExtendInput(
            num_accept_tokens=result.accept_lens,
            accept_tokens_cpu=result.next_token_ids.view(-1, n).cpu(),
            rids=tuple(req.rid for req in batch.reqs),
        )
        lens, rows = extend.num_accept_tokens.tolist(), extend.accept_tokens_cpu.tolist()
        self._step_tokens = sum(lens)  # committed this step (DraftingRuns' savings)
        with self.stats.one_step():  # the branches of a group verified together: one step
            for rid, row, k in zip(extend.rids, rows, lens):
                if self.drafter.has(rid):
                    self.drafter.append(rid, row[:k])
                    self._observe_shadows(rid, row[:k])
            self._observe_acceptance(extend.rids, lens, rows)
        current = set(extend.rids)
        for rid in current:
            self._awaiting_decode.pop(rid, None)
        for rid in self._decode_rids - current:  # left the decode batch: finished or retracted
            self._forget(rid)
        self._decode_rids = current

    def _observe_acceptance(self, rids: tuple[str, ...], accept_lens: list[int], rows: list[list[int]]) -> None:
        """`rows`: each request's committed tokens this step (its first `accept_lens`)."""
        for i, (rid, tree, k) in enumerate(zip(rids, self._step_trees, accept_lens)):
            depth = tree.height  # drafts a chain through the tree could have accepted
            self._observe(rid, self._draft_source, depth, min(self._drafts_accepted(i, rows[i][: k - 1]), depth))
        self._steps += 1
        if self._steps % 2000 == 0:
            logger.info("SPECSOT cost model after %d steps: %s", self._steps, self.cost.info())


    def _drafts_accepted(self, row: int, committed: list[int]) -> int:
        """Drafts of request `row`'s tree that verify accepted, given the tokens it committed
        before its bonus token: all of them, whatever path of the tree they took."""
        return len(committed)

    def _observe(self, rid: str, source: str, depth: int, accepted: int) -> None:
        """One tree of `depth` whose first `accepted` drafts were (or would have been) right:
        into its group's estimate, and into acceptance by depth under `source`."""
        self.stats.observe(self._stats_key(rid), depth, accepted, self._role(rid))
        if depth > 0:
            self.by_depth.setdefault(source, DepthAcceptance()).observe(depth, accepted)


def steps_left(reqs, tokens_per_step: float) -> float:
    """Steps a request of the batch has left on average, at `tokens_per_step` each, from its
    `max_new_tokens` (inf where a request has none: its end is unknown)."""
    left = []
    for req in reqs:
        cap = getattr(getattr(req, "sampling_params", None), "max_new_tokens", None)
        if cap is None:
            return math.inf
        left.append(max(1, cap - len(req.output_ids)))
    return sum(left) / len(left) / max(tokens_per_step, 1.0)


ADAPTIVE, FIXED = "adaptive", "fixed"


def adaptive_config(server_args, max_budget: int) -> AdaptiveConfig | None:
    """SPECSOT's budget policy: every budget from 0 (plain) to the window's, or as
    --speculative-adaptive-config says with --speculative-adaptive; None for a fixed window
    (SGLANG_SPECSOT_FIXED_WINDOW=1, without the flag).

    Without the flag SPECSOT still sizes every step's drafts from measured costs and
    acceptance: a fixed window loses to plain decoding on large batches of SoT branches,
    where the policy stays level with plain, and the policy matches it at batch 1. It weighs
    every budget, not only the whole window against a plain decode: exploring and catching
    up a whole chain cost more than one-token drafts. Figures: docs/benchmarks.md.

    SGLang turns its own (EAGLE-only) controller off for other algorithms during argument
    resolution and says so in a warning; the flag as the user gave it is still on the
    pristine server_args the worker receives.
    """
    if budget_mode(server_args) == FIXED:
        logger.info("SPECSOT drafts the whole window every step (%s=1)", FIXED_WINDOW_ENV)
        return None
    path = getattr(server_args, "speculative_adaptive_config", None)
    if path is not None and not getattr(server_args, "speculative_adaptive", False):
        # SGLang reads the file only with the flag, and SPECSOT is adaptive without it: a
        # file given alone would be dropped without a word, and a run would measure defaults.
        raise ValueError(
            f"--speculative-adaptive-config {path} is read only with --speculative-adaptive: "
            "add --speculative-adaptive, or drop the config to use SPECSOT's defaults"
        )
    if path is None:
        config = AdaptiveConfig.default(max_budget)
    else:
        with open(path) as f:
            config = AdaptiveConfig.from_json(f.read(), max_budget)
    logger.info("SPECSOT adaptive draft budgets on (SPECSOT's own policy, not SGLang's EAGLE controller): %s", config)
    return config


def budget_mode(server_args) -> str:
    """FIXED with SGLANG_SPECSOT_FIXED_WINDOW=1 and without --speculative-adaptive (the flag
    wins), else ADAPTIVE."""
    value = os.environ.get(FIXED_WINDOW_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{FIXED_WINDOW_ENV}={value!r}: set it to 1 (draft the whole window every step) or 0 / unset")
    if getattr(server_args, "speculative_adaptive", False):
        return ADAPTIVE
    return FIXED if value == "1" else ADAPTIVE


def _host_links(trees: tuple[DraftTree, ...], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(first child, next sibling) per node, as SGLang's tree kernels lay them out."""
    next_token = torch.full((len(trees), n), -1, dtype=torch.int64)
    next_sibling = torch.full((len(trees), n), -1, dtype=torch.int64)
    for b, tree in enumerate(trees):
        last_child: dict[int, int] = {}
        for node in range(1, tree.size):
            parent = tree.parents[node]
            if parent in last_child:
                next_sibling[b, last_child[parent]] = node
            else:
                next_token[b, parent] = node
            last_child[parent] = node
    return next_token, next_sibling
