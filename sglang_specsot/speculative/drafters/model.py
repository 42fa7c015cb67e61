"""Drafting with a draft model: its chain or tree (SGLang's standalone draft worker), the SoT
context filling the rest of the verify window.

The draft model proposes from the top-k its last draft-extend left in `batch.spec_info`
(relayed by the scheduler through `FutureMap.stash`); its draft-extend runs over the step's
committed tokens, every step as in SGLang, or deferred on plain steps where the chain is
adaptive on the eager CPU draft backend (`model_extend.DeferredExtend`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sglang_specsot.costs.cost_model import CostModel
from sglang_specsot.costs.probe import probe_or_none, storage_key, unmeasured
from sglang_specsot.host import adapter as sgl
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.drafters import Proposal
from sglang_specsot.speculative.drafters import model_chains as chains
from sglang_specsot.speculative.drafters import context_alone
from sglang_specsot.speculative.drafters.context import ContextDrafting, verified
from sglang_specsot.speculative.drafters.context_alone import ContextAlone
from sglang_specsot.speculative.drafters.model_extend import (
    DeferredExtend,
    leading_agreement,
)
from sglang_specsot.speculative.extend_backlog import ExtendBacklog
from sglang_specsot.speculative.host_sync import Committed
from sglang_specsot.speculative import vocab
from sglang_specsot.speculative.inputs import SoTDraftInput
from sglang_specsot.speculative.draft_kind import draft_kind
from sglang_specsot.speculative.model_draft import DraftSeams, RunnerUps, SoTDraftModel, SoTEagleHead
from sglang_specsot.speculative.policy.acceptance import (
    AcceptanceStats,
    FirstDraftCalibration,
)
from sglang_specsot.speculative.policy.chains import ChainStop
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from sglang_specsot.speculative.policy.step_policy import StepPolicy
from sglang_specsot.speculative.policy.values import StepDecision, Verified

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelProposal(Proposal):
    """A draft model's step: what its chains were, for what it learns after verify."""

    drafts: tuple | None = None  # per request, (probability, token) of each model draft by depth
    fed: tuple | None = None  # per request, the chain tokens the draft forwards fed (KV written)
    chains: tuple | None = None  # per request, its chain's drafts where runner-ups joined it
    chain_width: int | None = None  # the width the plan priced, without runner-ups
    long_match: tuple | None = None  # per request, the context's long-match chain (or None)

    def priced_width(self, verify_width: int) -> int:
        # Runner-ups widen a verify beyond its plan where the cost model said the rows were
        # free: its time is the time of a step of its chains' width.
        return self.chain_width or verify_width


class ModelCosts:
    """A draft-model step costs its draft forwards, its draft-extend and its verify rows."""

    bounded_by_wider = False  # a chain stopped early or skipped is cheaper than a full one
    learns_from_shadows = False  # a context shadow says nothing of the model's chains

    def __init__(self, drafter: ModelDrafting):
        self.drafter = drafter

    @property
    def min_budget(self) -> int:
        # A fixed chain or tree is verified whole; an adaptive chain may be cut to nothing.
        d = self.drafter
        return 0 if d.chain_adaptive else d.model.tree_size - 1

    def candidate_budgets(self, budgets: tuple[int, ...]) -> tuple[int, ...]:
        # An adaptive chain's budget is its length: context nodes beyond it would be priced
        # as chain tokens, so a wider window would cost rows for no more tokens.
        if not self.drafter.chain_adaptive:
            return budgets
        return tuple(sorted({min(b, self.drafter.model.max_steps) for b in budgets}))

    def modelled_ms(self, bs: int, width: int) -> float:
        # The catch-up a drafting step needs first (with the backlog) is weighed apart, as
        # setup the plan must repay; a drafting step then extends what its chain did not write.
        d = self.drafter
        deferred = d.deferred
        forwards = max(0, d.chain_steps(width) - 1)
        extend = width > 1 or deferred is None
        rows = None if deferred is None else bs * min(width, 2)
        return d.cost.step_ms(bs, width, draft_steps=forwards, draft_extend=extend, extend_rows=rows)


class ModelPricing:
    """This step's setup (a backlog's catch-up) and the draft's first-token confidence."""

    def __init__(self, drafter: ModelDrafting, batch):
        self.drafter, self.batch = drafter, batch

    def setup_ms(self) -> float:
        deferred = self.drafter.deferred
        return 0.0 if deferred is None else deferred.setup_ms(self.batch)

    def first_acceptance(self, firsts) -> list[float]:
        return self.drafter.first_acceptance(self.batch, list(firsts))


class ModelDrafting:
    """The draft model's chain or tree, merged with the SoT context into one verify tree."""

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker, context: ContextDrafting,
                 cost: CostModel, config: AdaptiveConfig | None, window: int, device, device_support, timed: bool):  # fmt: skip
        self.server_args, self.target_worker, self.device, self.timed = server_args, target_worker, device, timed
        self.context, self.cost, self.config, self.window = context, cost, config, window
        self.kind = draft_kind(sgl.get_spec().speculative_draft_model_path)
        model_class = SoTEagleHead if self.kind.is_head else SoTDraftModel
        self.model: DraftSeams = model_class(server_args, gpu_id, nccl_port, target_worker)
        check_vocab_compatible(target_worker, self.model)
        self.model.confidence = config is not None  # its first-token probability, for the policy
        # On CPU, int8 draft weights where measured faster; before the probe, which times them.
        # Not a head's: one layer, whose embedding (and maybe LM head) SGLang swaps for the
        # target's only at pool allocation.
        shared = {storage_key(p) for p in target_worker.model_runner.model.parameters()}
        self.draft_int8 = None if self.kind.is_head else device_support.prepare_draft_model(
            self.model.draft_runner.model, shared, device
        )  # fmt: skip
        cost.draft = probe_or_none(self.model.draft_runner.model, "draft model") or unmeasured()
        # Its overhead is per layer, like the target's: the target's, scaled by layers, until
        # the draft has run forwards of its own.
        cost.draft.prior = cost.target
        cost.draft.prior_share = _layers(self.model.draft_runner) / _layers(target_worker.model_runner)
        self.costs = ModelCosts(self)
        # The SoT context alone, planned apart, wherever budgets adapt (not a fixed window).
        self.alone = None if config is None else ContextAlone(context, config, window)
        self.topk_source = "extend"  # what computed the relayed top-k: an extend or a catch-up
        self.first_calibration = FirstDraftCalibration()
        self.long_match_stats = AcceptanceStats(config or AdaptiveConfig.default(window - 1))
        self.draft_model_skips = 0
        self.chain_depths = [0] * self.model.max_steps  # chains stopped by confidence, by depth
        self.runner_up_counts = {"steps": 0, "verified": 0, "accepted": 0}
        logger.info("SPECSOT cost model measured at start-up (draft, ms by rows): %s", cost.draft.info())
        logger.info(
            "SPECSOT drafts with %s (%s): %d-node %s per request, up to %d SoT-context nodes more",
            sgl.get_spec().speculative_draft_model_path, self.kind.value, self.model.tree_size,
            "chain" if self.model.topk == 1 else "tree", window - self.model.tree_size,
        )  # fmt: skip

    @property
    def chain_adaptive(self) -> bool:
        # Budgets shorten the chain only where it is a chain (top-k 1) and its backend takes a
        # step count per call; otherwise every step drafts the full tree.
        return self.config is not None and self.model.topk == 1 and self.model.variable_steps

    def chain_steps(self, width: int) -> int:
        """Draft-model steps of a step whose widest budget is `width - 1` tokens."""
        if not self.chain_adaptive:
            return self.model.max_steps
        return min(width - 1, self.model.max_steps)

    @functools.cached_property
    def deferred(self) -> DeferredExtend | None:
        """Plain steps defer the draft-extend where the chain is adaptive (the CPU draft
        backend); with draft-extend CUDA graphs every step extends, as in SGLang. Read first
        at the first prefill, after the scheduler built the attention backends."""
        if self.fixed_chain_reason is not None or not self.config.defer_draft_extend:
            return None
        if self.model.reads_target_hidden:
            # A head's extend reads the target's hidden states of this step's verify, gone by
            # the next: it extends every step, as in SGLang.
            logger.info("SPECSOT: the %s head extends every step (its extend reads the step's target hidden states)", self.kind.value)
            return None
        chunk = self.server_args.chunked_prefill_size  # a catch-up pass is a prefill
        backlog = ExtendBacklog(max_rows=chunk) if chunk and chunk > 0 else ExtendBacklog()
        pool = self.target_worker.model_runner.token_to_kv_pool
        return DeferredExtend(self.model, self.cost, backlog, self.context.history, pool.size + pool.page_size,
                              self.device, self.timed)  # fmt: skip

    @functools.cached_property
    def fixed_chain_reason(self) -> str | None:
        """Why the budget policy cannot shorten this server's chains, or None where it can:
        logged once, in /server_info. Never silently different: where the chain is fixed,
        draft confidence, runner-ups and deferred draft-extend are off with it."""
        if self.config is None:
            return "budgets are fixed (SGLANG_SPECSOT_FIXED_WINDOW)"
        if self.chain_adaptive:
            return None
        reason = (
            "the draft is a tree (--speculative-eagle-topk > 1), drafted and verified whole" if self.model.topk != 1
            else "the draft's attention backend drafts whole chains (draft CUDA graphs, or a backend other than specsot_cpu)"
        )  # fmt: skip
        logger.warning(
            "SPECSOT: adaptive draft chains, draft confidence, runner-ups and deferred draft-extend are off: %s. "
            "Every drafting step drafts the full chain and every step extends the draft; the policy still "
            "chooses between drafting and plain steps from measured costs", reason,
        )  # fmt: skip
        return reason

    @functools.cached_property
    def takes_runner_ups(self) -> bool:
        """Whether chains take runner-ups; asked from the first draft on, when the draft's
        backends exist. From then on, the draft model keeps its second choices."""
        if not (self.chain_adaptive and self.config.runner_ups):
            return False
        self.model.runner_ups = RunnerUps()
        return True

    @property
    def catch_ups(self) -> int:
        return 0 if self.deferred is None else self.deferred.backlog.catch_ups

    @property
    def settles_late(self) -> bool:
        """Whether a step's committed tokens may wait for the next draft: SGLang's own extend
        (as on a GPU) reads them on the device, so they are read after the next draft model's
        forwards, with its tree, in one wait. A deferred extend or an adaptive chain reads them
        on the host (both run on the CPU draft backend only, where reads cost no wait)."""
        return self.deferred is None and not self.chain_adaptive

    def pricing(self, batch) -> ModelPricing:
        return ModelPricing(self, batch)

    def after_prefill(self, batch, result) -> SoTDraftInput:
        if self.deferred is not None:
            self.deferred.defer_prefill(batch)
            topk_p, topk_index = self.deferred.stale_topk(len(batch.reqs))
            return SoTDraftInput(bonus_tokens=result.next_token_ids, topk_p=topk_p, topk_index=topk_index)
        hidden = result.logits_output.hidden_states if self.model.reads_target_hidden else None
        return SoTDraftInput.from_eagle(self.model.extend_after_prefill(batch, result.next_token_ids, hidden))

    # -- draft -----------------------------------------------------------------------------

    def draft(self, batch, decision: StepDecision, policy: StepPolicy, settle: Callable[[], None] = lambda: None) -> ModelProposal:  # fmt: skip
        """The model's trees, cut to the plan's budgets (or where its confidence stops them),
        with runner-ups where they pay, each filled with SoT-context nodes to its budget.
        `settle()` runs before the SoT context is read: after the model's forwards and its
        tree's read where it can (`settles_late`), so that read's wait covers both."""
        self.takes_runner_ups  # noqa: B018 - decided at the first draft (see there)
        alone = None if self.alone is None else self.alone.decide(decision.view)
        if alone is not None and self.alone.beats(alone, decision):
            settle()
            return ModelProposal(self.alone.trees(batch, alone), "context", alone)
        if not self.settles_late:
            settle()
        sizes, source, fed, stop = decision.sizes, "context", None, None
        seeds: list[DraftTree | None] = [None] * len(sizes)
        long_match = chains.long_match_chains(self, batch)
        drafts = self.chain_steps(max(sizes)) > 0
        if drafts and chains.context_pays(self, sizes, long_match, decision):
            self.draft_model_skips += 1  # the SoT context alone drafts this step
        elif drafts:
            if self._topk_stale(batch):
                # Step one reads the top-k of the draft's last extend: bring it up to date.
                batch.spec_info.topk_p, batch.spec_info.topk_index = self.deferred.catch_up(batch, batch.seq_lens)
                self.topk_source = "catch_up"
                if self.chain_adaptive:  # the draft's confidence is known only now
                    decision = policy.replan(decision, self.first_acceptance(batch, list(decision.firsts)))
                    sizes = decision.sizes
            source = self.topk_source
            stop = chains.chain_stop(self, batch, sizes, decision, policy)
            steps = self.chain_steps(max(sizes))
            if stop is not None:
                steps = self.model.max_steps if stop.go_on() else 1
            seeds, fed = self._model_trees(batch, steps, stop)
            if stop is not None:  # the chains end where the draft's confidence said
                sizes = [1 + d for d in stop.depths()]
                self.chain_depths[stop.depth - 1] += 1
        settle()  # the model's tree is on the host: its read waited for the committed tokens too
        if alone is not None:
            self.alone.propose_shadows(batch)
        notes = None
        if self.chain_adaptive:
            seeds = [chain_prefix(seed, n - 1) for seed, n in zip(seeds, sizes)]
            notes = chains.note_drafts(batch, seeds, stop)
        runner_up_chains, chain_width = None, None
        if self.takes_runner_ups and any(seeds):
            reach = stop.reach if stop is not None else chains.planned_reach(seeds, decision)
            seeds, sizes, runner_up_chains, chain_width = chains.with_runner_ups(self, batch, seeds, sizes, reach, policy)
        trees = tuple(
            self.context.tree(req, max(n, seed.size if seed else 1), seed)
            for req, seed, n in zip(batch.reqs, seeds, sizes)
        )  # fmt: skip
        return ModelProposal(trees, source, decision, notes, fed, runner_up_chains, chain_width, long_match)

    def _model_trees(self, batch, steps: int, stop: ChainStop | None) -> tuple[list[DraftTree | None], tuple | None]:
        """The draft model's trees of `steps` steps, and per request the chain tokens its
        forwards fed (top-1 chains: forward i wrote the KV of the chain's token i+1)."""
        if steps == 0:
            return [None] * len(batch.reqs), None
        start = time.perf_counter()
        seeds = self.model.draft_trees(batch, steps, stop)
        forwards = steps - 1 if stop is None else stop.depth - 1  # step one reads the relayed top-k
        fed = None
        if self.model.topk == 1:
            fed = tuple(list(seed.tokens[1 : 1 + forwards]) if seed else [] for seed in seeds)
        if self.timed and forwards > 0:
            per_forward = (time.perf_counter() - start) * 1e3 / forwards
            self.cost.draft.observe(len(batch.reqs) * self.model.topk, per_forward)
        return seeds, fed

    def first_acceptance(self, batch, firsts: list[float]) -> list[float]:
        """Each request's calibrated chance that the draft's first token is accepted, from the
        top-k its last draft-extend left (no forward); the running `firsts` where that top-k
        is stale (a deferred extend) or the chain is not adaptive."""
        if not self.chain_adaptive or self._topk_stale(batch):
            return firsts
        topk_p = getattr(batch.spec_info, "topk_p", None)
        if topk_p is None or topk_p.shape[0] != len(firsts):
            return firsts
        return [self.first_calibration.rate(q, f) for q, f in zip(topk_p[:, 0].tolist(), firsts)]

    def _topk_stale(self, batch) -> bool:
        return self.deferred is not None and self.deferred.stale([req.rid for req in batch.reqs])

    # -- after verify ----------------------------------------------------------------------

    def accept(self, reqs, committed: Committed, proposal: ModelProposal) -> Verified:
        """As the context's, except that with runner-ups a request's acceptance is how far
        its chain was right (what plans and ChainStop price); a runner-up taken is counted apart."""
        rows, lens = committed.rows, committed.lens
        shadows = self.context.append(reqs, rows, lens)
        if proposal.decision.planner == context_alone.NAME:  # the context's own policy learns it all
            self.context.calibrate(proposal, lens)
            return verified(proposal, [k - 1 for k in lens], shadows, sum(lens))
        if self.alone is not None:
            self.alone.learn_shadows(proposal.decision.view, shadows)
        shadows = []  # the context's shadows say nothing of the model's drafts
        if proposal.chains is None:
            return verified(proposal, [k - 1 for k in lens], shadows, sum(lens))
        accepted = []
        for chain, row, k in zip(proposal.chains, rows, lens):
            committed = row[: k - 1]
            agree = leading_agreement(chain, committed)
            if agree < min(len(chain), len(committed)):
                self.runner_up_counts["accepted"] += 1
            accepted.append(agree)
        return verified(proposal, accepted, shadows, sum(lens))

    def draft_extend(self, batch, result, proposal: ModelProposal, policy: StepPolicy) -> bool:
        """Calibrate on this step's drafts, then extend the draft over the committed tokens
        (or defer it); whether a deferrable extend ran."""
        chains.observe_drafts(self.first_calibration, result, proposal.drafts)
        chains.observe_long_match(self.long_match_stats, result, proposal.long_match)
        if self.deferred is None:
            # SGLang's own draft-extend over the verify window (as with CUDA graphs).
            self.topk_source = "extend"
            rows = len(batch.reqs) * result.speculative_num_draft_tokens
            timed_call(self.cost, self.timed, rows, self.model.extend_after_verify, batch, result)
            return False
        view = self.context.requests.view(batch.reqs)
        ran = self.deferred.draft_extend(batch, result, proposal.fed, policy, view, self.pricing(batch))
        if ran is not None:
            self.topk_source = ran
        return ran is not None

    def policies(self) -> dict[str, StepPolicy]:
        """Policies of its own that plan some steps (the worker routes those steps' evidence)."""
        return {} if self.alone is None else {context_alone.NAME: self.alone.policy}

    def forget(self, rid: str) -> None:
        self.context.forget(rid)
        if self.alone is not None:
            self.alone.policy.forget(rid)
        if self.model.runner_ups is not None:
            self.model.runner_ups.forget(rid)

    def clear(self) -> None:
        self.context.clear()

    def report(self) -> dict:
        report = self.context.report() | {"draft_int8": None if self.draft_int8 is None else self.draft_int8.info()}
        report["fixed_chain"] = self.fixed_chain_reason
        report["draft_kind"] = self.kind.value
        report["context_alone"] = None if self.alone is None else self.alone.report()
        if self.deferred is not None:
            report["draft_extend"] = self.deferred.backlog.info()
        if self.chain_adaptive:
            report["first_draft_calibration"] = self.first_calibration.info()
            report["chain_depths"] = list(self.chain_depths)
            if self.model.runner_ups is not None:
                report["runner_ups"] = dict(self.runner_up_counts)
            report["long_match"] = {
                "p": round(self.long_match_stats.p(chains.LONG_MATCH), 3), "draft_model_skips": self.draft_model_skips,
            }  # fmt: skip
        return report

    def step_log_fields(self, proposal: ModelProposal) -> dict:
        drafts = proposal.drafts
        return {
            "first_draft_q": None if drafts is None else [round(e[0][0], 4) if e else None for e in drafts],
            "draft_extend": None if self.deferred is None else self.deferred.backlog.info(),
            "cost": {"draft_overhead_ms": round(self.cost.draft.current_overhead_ms(), 3)},
        }


def timed_call(cost: CostModel, timed: bool, rows: int, extend, *args):
    """`extend(*args)` and its time in ms, folded into the draft's cost where `timed`."""
    start = time.perf_counter()
    out = extend(*args)
    ms = (time.perf_counter() - start) * 1e3
    if timed:
        cost.draft.observe(rows, ms)
    return out, ms


def check_vocab_compatible(target_worker, draft: DraftSeams) -> None:
    """The draft must speak the target's token ids: the same vocabulary or a prefix of it, on
    a tokenizer that maps the ids both have alike (vocab.py). A prefix draft's embedding reads
    committed ids past its rows as its last row (the drafts then miss, verify decides)."""
    target_size = target_worker.model_runner.model_config.vocab_size
    draft_size = draft.draft_runner.model_config.vocab_size
    path = sgl.get_spec().speculative_draft_model_path
    vocab.check_draft_vocabulary(path, target_size, draft_size, target_worker.tokenizer, draft.draft_worker.tokenizer)
    if draft_size < target_size:
        sgl.clamp_draft_input_ids(draft.draft_runner, draft_size)
        logger.info("SPECSOT draft vocabulary: the first %d of the target's %d ids", draft_size, target_size)


def chain_prefix(seed: DraftTree | None, budget: int) -> DraftTree | None:
    """The first `budget` drafts of a chain (nodes are in chain order), or None for none."""
    if seed is None or budget <= 0:
        return None
    keep = min(seed.size, budget + 1)
    return DraftTree(seed.tokens[:keep], seed.parents[:keep])


def _layers(model_runner) -> int:
    """Transformer layers of a model runner's model (SGLang's ModelConfig.num_hidden_layers)."""
    return max(1, int(model_runner.model_config.num_hidden_layers))
