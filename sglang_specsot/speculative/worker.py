"""The SPECSOT worker on SGLang's spec-V2 schema: one class for every drafter.

A decode step reads like the algorithm (`forward_batch_generation`): draft, verify,
`on_publish(new_seq_lens)`, draft_extend. There is no verify_done barrier: the next
iteration's seq_lens come through the FutureMap (`on_publish` here, `resolve_seq_lens_cpu` in
the scheduler), and the next draft input (`SoTDraftInput`) through `FutureMap.stash`. The
drafters' token histories are updated by this worker at draft-extend, so they never depend on
when the scheduler processes results (under overlap that is one iteration later).

The worker *has* a drafter (`drafters/`: the SoT context, or a draft model merged with it), a
budget policy (`policy/`, plain Python) and a telemetry (`telemetry.py`); it owns SGLang's
contract and nothing of how drafts are made or priced.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from sglang_specsot.costs import published
from sglang_specsot.costs.cost_model import CostModel
from sglang_specsot.costs.probe import probe_or_none, unmeasured
from sglang_specsot.host import adapter as sgl
from sglang_specsot.speculative import device
from sglang_specsot.speculative.device_times import DeviceStepTimes, cuda_timing_event
from sglang_specsot.speculative.draft_tree import pad_tree
from sglang_specsot.speculative.drafters import Drafter, Proposal
from sglang_specsot.speculative.drafters.context import ContextDrafting
from sglang_specsot.speculative.drafters.replay import ReplayedProposal, forced_acceptance, replaying
from sglang_specsot.speculative.host_sync import Committed, PendingCommit
from sglang_specsot.speculative.inputs import SoTDraftInput, SoTVerifyInput
from sglang_specsot.speculative.malloc_trim import MallocTrim
from sglang_specsot.speculative.memory import PythonTrace, memory_report
from sglang_specsot.speculative.policy.config import ADAPTIVE, FIXED, adaptive_config
from sglang_specsot.speculative.policy.values import Verified
from sglang_specsot.speculative.policy.step_policy import StepPolicy
from sglang_specsot.speculative.rank_agreement import RankAgreement, TimingLedger
from sglang_specsot.speculative.requests import RequestBook
from sglang_specsot.speculative.root_commit import commits_argmax, root_argmax
from sglang_specsot.speculative.static_shape import StaticShapeVerify, static_shape_requested
from sglang_specsot.speculative.telemetry import StepClock, Telemetry
from sglang_specsot.speculative.tree_masks import TreeMaskLayout, tree_mask_layout
from sglang_specsot.speculative.policy.tiers import VerifyTiers
from sglang_specsot.speculative.verify_input import along_accepted_paths, build_verify_input, host_links
from sglang_specsot.speculative.verify_runners import EagerVerify, verify_runner

logger = logging.getLogger(__name__)


@dataclass
class VerifiedStep:
    """A decode step after verify, until the host has taken in what it committed (`settle`):
    at the step's end, or where the drafter `settles_late` at the next step's draft, once the
    draft model's own read has waited for the device (the policy then learns a step late)."""

    reqs: tuple  # the step's requests (the scheduler may filter its batch before the settle)
    width: int  # verify rows per request
    proposal: Proposal
    clock: StepClock | None
    commit: PendingCommit  # the committed tokens' copy to the host, queued at verify end
    committed: Committed | None = field(default=None, init=False)  # set by SpecSoTWorker.accept
    verified: Verified | None = field(default=None, init=False)  # set by SpecSoTWorker.accept
    extended: bool = field(default=False, init=False)  # set by SpecSoTWorker.draft_extend


class SpecSoTWorker(sgl.SpecWorkerBase):
    """Speculative worker whose trees come from its drafter, sized by its budget policy."""

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker):
        super().__init__()
        self.server_args = server_args
        self.device_support = device.provided()
        self.bind_workers(target_worker)
        self.model_runner = target_worker.model_runner
        self.device = sgl.get_device().device
        self.device_type = torch.device(self.device).type  # "cpu", "cuda", ...
        self.num_draft_tokens: int = sgl.get_spec().speculative_num_draft_tokens
        # Every TP rank plans from rank 0's times: its start-up probe, and each step's
        # (`self.timings`), or the ranks' collectives could mismatch (rank_agreement.py).
        self.agreement = RankAgreement.for_tp()
        # Measured on every start-up and published in /server_info: SoT's routing prices by it.
        target_cost = self.agreement.agree(probe_or_none(self.model_runner.model, "target"))
        self.cost = CostModel(target=target_cost or unmeasured())
        if target_cost is not None:
            published.publish(target_cost)
            logger.info("SPECSOT cost model measured at start-up (target, ms by rows): %s", self.cost.info())
        self.timed = self.device_type == "cpu"  # the host waits for forwards
        # Without a measured curve nothing can be priced: the whole window every step, as SGLang's own algorithms.
        self.adaptive = adaptive_config(server_args, self.num_draft_tokens - 1) if target_cost is not None else None
        self.requests = RequestBook()
        # The SoT context: every drafter's trees are filled from it, and it alone may draft.
        self.context = ContextDrafting(self.requests, self.cost, adaptive=self.adaptive is not None)
        # SGLANG_SPECSOT_REPLAY (a benchmark tool): trees and accepted paths from a trace.
        self.drafter: Drafter = replaying(self._drafter(server_args, gpu_id, nccl_port, target_worker), self.num_draft_tokens)
        # One pickle: the draft's curve keeps the target's as its prior.
        self.cost.target, self.cost.draft = self.agreement.agree((self.cost.target, self.cost.draft))
        # An EAGLE head's extends read the target's hidden states of the prefill and of every
        # verify (EAGLE-3: its aux layers', concatenated); nothing else reads them.
        reads = self.draft_worker is not None and self.draft_worker.reads_target_hidden
        self.target_capture = sgl.CaptureHiddenMode.FULL if reads else None
        self.telemetry = Telemetry(self.cost, self.timed, self._device_times())
        self.policy = StepPolicy(self.adaptive, self.num_draft_tokens, self.drafter.costs,
                                 log_candidates=self.telemetry.step_log is not None)  # fmt: skip
        # Every policy that plans steps, by the name its decisions carry: the worker's, and any
        # of the drafter's own; each learns only from the steps it planned.
        self.planners = {self.policy.name: self.policy, **self.drafter.policies()}
        self.timings = TimingLedger(self.agreement, self.cost, self.planners)
        self.mask_layout = tree_mask_layout(self.device)
        logger.info("SPECSOT verify tree mask layout: %s", self.mask_layout.name)
        self.verifier = self._eager_or_twin()  # on CUDA, graphs replace it once captured (init_cuda_graphs)
        self._price_at_tiers()
        self._trace = PythonTrace.from_env()  # SGLANG_SPECSOT_TRACEMALLOC: a leak hunt's tracing
        self.trimmer = MallocTrim.from_env()  # SGLANG_SPECSOT_MALLOC_TRIM_S: kept heap memory returned
        self._loop_logged = False
        self._pending: VerifiedStep | None = None  # the last decode step, until settled

    def _drafter(self, server_args, gpu_id: int, nccl_port: int, target_worker) -> Drafter:
        """The SoT context alone, or a draft model merged with it (--speculative-draft-model-path)."""
        if sgl.get_spec().speculative_draft_model_path is None:
            return self.context
        from sglang_specsot.speculative.drafters.model import ModelDrafting

        drafter = ModelDrafting(
            server_args, gpu_id, nccl_port, target_worker, self.context, self.cost, self.adaptive,
            self.num_draft_tokens, self.device, self.device_support, self.timed,
        )  # fmt: skip
        self.bind_workers(target_worker, drafter.model)
        return drafter

    def _device_times(self) -> DeviceStepTimes | None:
        """Device events time the steps where the host does not wait for them (CUDA)."""
        return DeviceStepTimes(cuda_timing_event) if self.device_type == "cuda" else None

    def _eager_or_twin(self):
        n = self.num_draft_tokens
        if static_shape_requested():
            return StaticShapeVerify.for_model_runner(
                self.model_runner, self._graph_tiers(), self.server_args.max_running_requests
            )
        if self.device_type != "cuda":
            return EagerVerify(n, f"verify runs eagerly on {self.device_type}")
        return EagerVerify(n, "CUDA graphs are off (--disable-cuda-graph or --disable-decode-cuda-graph)")

    # -- what the scheduler asks of every spec worker -------------------------------------

    def init_cuda_graphs(self) -> None:
        """The target's verify graphs, one set per tier, then the draft model's (SGLang's
        STANDALONE graphs: its chain, and its draft-extend at the window). The scheduler calls
        this once the pools exist (scheduler.py:1124-1126)."""
        on_cuda = self.device_type == "cuda"
        if not (on_cuda and not isinstance(self.verifier, StaticShapeVerify) and sgl.verify_graphs_wanted()):
            super().init_cuda_graphs()
            return
        self.verifier = verify_runner(self.model_runner, self._graph_tiers())
        self._price_at_tiers()
        if self.draft_worker is None:
            return
        # A failed capture stops the start-up, as the verify graphs' does (verify_runners.py):
        # an eager draft would serve far slower than asked with only a log line to say so.
        try:
            with sgl.decode_graphs_on(self.num_draft_tokens, num_steps=sgl.get_spec().speculative_num_steps):
                super().init_cuda_graphs()
        except Exception as exc:
            raise RuntimeError(
                f"SPECSOT: capturing the draft model's graphs failed ({type(exc).__name__}: {exc}). Fix the "
                "cause, or pass --disable-cuda-graph (or --disable-decode-cuda-graph) to draft and verify eagerly"
            ) from exc

    def _price_at_tiers(self) -> None:
        for policy in self.planners.values():
            policy.tiers = self.verifier.tiers

    def _graph_tiers(self) -> VerifyTiers:
        return VerifyTiers.for_graphs(self.num_draft_tokens, draft_model=self.draft_worker is not None)

    def alloc_memory_pool(self, **kwargs) -> None:
        if self.draft_worker is not None:
            sgl.BaseSpecWorker.alloc_memory_pool(self, **kwargs)  # its own KV on the shared slot ids
            return
        # The target's pools exist by now (scheduler.py:1098-1111); without a draft model we own no KV.
        self.req_to_token_pool, self.token_to_kv_pool_allocator = self.target_worker.get_memory_pool()

    @property
    def last_shared_read_runner(self):
        # With a draft model, its draft-extend is the step's last shared-buffer read
        # (base_spec_worker.py:249; as EAGLEWorkerV2.last_shared_read_runner).
        if self.draft_worker is None:
            return self.target_worker.model_runner
        return self.draft_worker.draft_runner

    @property
    def spec_v2_attn_backends(self) -> tuple:
        target = self.target_worker.model_runner.attn_backend
        dw = self.draft_worker
        if dw is None:
            return (target,)
        return (target, dw.draft_attn_backend, dw.draft_extend_attn_backend or dw.draft_runner.attn_backend)

    def clear_cache_pool(self) -> None:
        self.settle()
        self.drafter.clear()
        self.requests.clear()
        # What drafting earned is kept (step costs, drafting runs): reset, every flush would
        # make the server cold again. The groups are gone with the cache.
        for policy in self.planners.values():
            policy.stats.forget_groups()

    def speculative_state_report(self) -> dict:
        """What /server_info shows of SPECSOT (host change server-info-specsot)."""
        return {"specsot": {
            "cost_model": self.cost.info(),
            "adaptive": self.adaptive is not None,
            "budget_mode": FIXED if self.adaptive is None else ADAPTIVE,
            **self.policy.report(),
            **self.drafter.report(),
            "memory": {**memory_report(self.context.context, self._trace), "trim": self.trimmer.report()},
            "omp_spin": self.device_support.thread_report(),
            "verify_graphs": self.verifier.info(),
            "device_step_times": self.telemetry.info(),
        }}  # fmt: skip

    # -- one step --------------------------------------------------------------------------

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        self._begin_step(on_publish)
        if not batch.forward_mode.is_decode():
            return self._forward_prefill(batch, on_publish, pp_proxy_tensors)
        clock = self.telemetry.start(self.drafter.catch_ups)
        verify_input, proposal = self.draft(batch)
        clock.mark("draft")
        result = self.verify(batch, verify_input, clock, pp_proxy_tensors, proposal)
        if on_publish is not None:
            on_publish(result.new_seq_lens)  # before draft-extend: the fence is at verify end
        clock.mark("verify")
        self._pending = self.draft_extend(batch, result, proposal, clock)
        clock.mark("draft_extend")
        if not self.drafter.settles_late:
            self.settle()
        return result

    def settle(self) -> None:
        """The last decode step's committed tokens into the drafter and the policy, and its
        outcome into the ledgers; a no-op where it is settled already."""
        step, self._pending = self._pending, None
        if step is None:
            return
        if step.verified is None:
            self.accept(step)
        self.telemetry.trace_step(step.reqs, step.proposal, step.width, step.committed)
        for outcome in self.telemetry.finish(step.clock, step.proposal, step.width, step.verified, step.extended,
                                             self.drafter, step.committed.lens):  # fmt: skip
            self.timings.observe(outcome.decision.planner, outcome)

    def _begin_step(self, on_publish) -> None:
        self.timings.agree()  # every rank: the times rank 0 measured, before anything is planned
        # Only the overlap event loop passes on_publish (scheduler.py:4690); the sync loop
        # does not (:4827). Logged once, so users and tests can see which loop drives us.
        if not self._loop_logged:
            self._loop_logged = True
            loop = "overlap (event_loop_overlap)" if on_publish is not None else "synchronous"
            logger.info("SPECSOT worker driven by the %s scheduler loop", loop)
        for rid in self.requests.finished_at_prefill():
            self._forget(rid)
        self.trimmer.tick()

    def _forward_prefill(self, batch, on_publish, pp_proxy_tensors):
        self.settle()  # the last decode step, before a prefill changes the batch's requests
        result = self.target_worker.forward_batch_generation(
            batch, pp_proxy_tensors=pp_proxy_tensors, capture_hidden_mode=self.target_capture
        )
        # Spec-V2 convention: seq_lens is the length before this iteration's sampled token.
        result.new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        if batch.forward_mode.is_extend() and result.next_token_ids is not None:
            self._start_requests(batch, result.next_token_ids)
            result.next_draft_input = self.drafter.after_prefill(batch, result)
        return result

    def _start_requests(self, batch, sampled: torch.Tensor) -> None:
        for req, token in zip(batch.reqs, sampled.tolist()):
            if getattr(req, "is_chunked", 0) > 0:
                continue  # a middle chunk's sample is discarded by the scheduler
            self.context.start(req, [token])
            self.requests.prefilled(req)

    def _forget(self, rid: str) -> None:
        self.drafter.forget(rid)
        self.policy.forget(rid)
        self.requests.forget(rid)

    # -- draft -----------------------------------------------------------------------------

    def draft(self, batch) -> tuple[SoTVerifyInput, Proposal]:
        """One tree per request within the policy's budgets, all padded to one width."""
        decision = self.policy.decide(self.requests.view(batch.reqs), self.drafter.pricing(batch))
        self.room_for_draft_mask()
        proposal = self.drafter.draft(batch, decision, self.policy, self.settle)
        # The widest tree sets the window, padded to a tier where graphs replay: where no
        # request has a draft, verify is a plain decode.
        n = self.verifier.tiers.padded(max(t.size for t in proposal.trees))
        trees = [pad_tree(t, n, filler=t.tokens[0]) for t in proposal.trees]
        context_len = self.model_runner.model_config.context_len
        tags = self.requests.tag_tuple(batch.reqs)
        verify_input = build_verify_input(
            batch, trees, tags, self.device, self.mask_layout, context_len, self.target_capture,
            self.mask_buffer(n, len(trees)),
        )  # fmt: skip
        return verify_input, proposal

    def mask_buffer(self, width: int, bs: int):
        """The mask buffer of the tier that verifies `width` rows, where its backend reads our
        FULL layout and the batch fits: the tree is written there, as SGLang's EAGLE writes its
        own (eagle_worker_common.py:405-413), so no new mask is made and copied each step."""
        verify_mask = getattr(self.verifier.tier_backend(width), "verify_mask", None)
        if verify_mask is None or not verify_mask.is_read or not verify_mask.fits(bs):
            return None
        if self.mask_layout != TreeMaskLayout.FULL or int(verify_mask.mode) != int(TreeMaskLayout.FULL):
            return None
        return verify_mask.buffer

    def room_for_draft_mask(self) -> None:
        """The window tier's attention backend on the target, for a draft model's draft: SGLang's
        draft writes its own tree mask into the installed backend's buffer, checking only the
        batch size (eagle_worker_common.py:405-413, VerifyMask.fits). A narrower tier's buffer
        (one row per request after a width-1 step) would be written past its end at long
        context; the window's holds any draft tree (at most the window's nodes), and each
        verify installs its own tier again."""
        backend = self.verifier.tier_backend(self.verifier.tiers.window)
        if backend is not None and self.draft_worker is not None:
            self.model_runner.attn_backend = backend

    # -- verify ----------------------------------------------------------------------------

    def verify(self, batch, verify_input: SoTVerifyInput, clock: StepClock, pp_proxy_tensors=None, proposal=None):
        """One TARGET_VERIFY forward over every tree, then SGLang's exact tree sampling (at
        width 1 what it would commit, where that is known: `root_commit`)."""
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
        clock.mark("target_start")
        clock.target_rows = bs * n
        target = self.verifier.forward(self.target_worker, batch, n, pp_proxy_tensors)
        clock.mark("target_end")
        clock.target_ms = clock.ms("target_end", "target_start")
        if self.timed:
            self.cost.target.observe(bs * n, clock.target_ms)
        logits_output = target.logits_output
        if batch.sampling_info.has_custom_logit_processor:
            self._apply_processors(batch, verify_input, logits_output)
        grammar_mask = self._grammar_mask(batch, verify_input) if batch.has_grammar else None
        watermark = self.model_runner.watermark_state
        if n == 1 and commits_argmax(batch.sampling_info, grammar_mask, watermark):
            predict, accept_lens, accept_index = root_argmax(logits_output.next_token_logits, bs)
        else:
            predict, accept_lens, accept_index = sgl.eagle_sample(
                verify_input, batch, logits_output, grammar_mask, watermark_state=watermark,
            )  # fmt: skip
        if isinstance(proposal, ReplayedProposal):  # SGLANG_SPECSOT_REPLAY: the trace's paths, not the target's
            predict, accept_lens, accept_index = forced_acceptance(proposal, verify_input, predict)
        new_seq_lens = batch.seq_lens + accept_lens
        sgl.commit_mamba_states_after_verify(self.target_worker, batch, accept_lens, accept_index, n)
        accept_tokens = predict[accept_index]  # shape: (bs, n); rows past accept_lens are garbage
        if self.target_capture is not None:
            # The head's extend reads row j of a request's window as (token j + 1, the target's
            # hidden state at node j) along the accepted path, as SGLang lays out a tree's
            # accepted path (eagle_worker_common.py:505-525) for its draft-extend.
            logits_output.hidden_states = along_accepted_paths(logits_output.hidden_states, accept_index)
        if n > 1:  # at width 1 the root is already in its request's next KV slot (root_commit)
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

    def _apply_processors(self, batch, verify_input: SoTVerifyInput, logits_output) -> None:
        # SGLang's EAGLE verify skips custom processors; here each tree node's row gets its
        # request's processor, seeing the history up to that node (the drafter's history is
        # current even when the scheduler's output_ids lag under overlap).
        from sglang_specsot.speculative.verify_processors import apply_verify_processors

        histories = [self.context.context.tokens(req.rid) for req in batch.reqs]
        apply_verify_processors(
            logits_output.next_token_logits, batch.sampling_info, batch.reqs, verify_input.host_trees, histories,
        )  # fmt: skip

    def _grammar_mask(self, batch, verify_input: SoTVerifyInput):
        # Built from the host trees: no device readback, and constrained requests stay
        # constrained for every drafted token (spec_utils.build_grammar_vocab_mask).
        next_token, next_sibling = host_links(verify_input.host_trees, verify_input.draft_token_num)
        tokens = torch.tensor([t.tokens for t in verify_input.host_trees], dtype=torch.int64)  # shape: (bs, n)
        tree = sgl.GrammarTree.from_host(next_token, next_sibling, tokens)
        return sgl.build_grammar_vocab_mask(
            reqs=batch.reqs, tree=tree, sampling_info=batch.sampling_info,
            device=verify_input.retrieve_next_token.device, barrier=None,
        )  # fmt: skip

    # -- draft-extend ----------------------------------------------------------------------

    def draft_extend(self, batch, result, proposal: Proposal, clock: StepClock | None = None) -> VerifiedStep:
        """The drafter's own extend, after the committed tokens went into its context and the
        policy's estimates (`accept`) unless the drafter `settles_late`: its extend reads
        nothing on the host, so the committed tokens are read at its next draft."""
        # Not the result: a step waiting to settle holds no logits.
        step = VerifiedStep(tuple(batch.reqs), result.speculative_num_draft_tokens, proposal, clock, PendingCommit.of(result))
        if not self.drafter.settles_late:
            self.accept(step)
        step.extended = self.drafter.draft_extend(batch, result, proposal, self.policy)
        return step

    def accept(self, step: VerifiedStep) -> None:
        """The committed tokens (read here: the step's one blocking read, unless an earlier
        read has waited for them) into the drafter's context and the policy's estimates;
        requests that left the decode batch are forgotten."""
        step.committed = step.commit.settle()
        step.verified = self.drafter.accept(step.reqs, step.committed, step.proposal)
        decision = step.proposal.decision
        self.planners[decision.planner].learn(decision.view, step.verified)
        for rid in self.requests.decoded(tuple(req.rid for req in step.reqs)):
            self._forget(rid)
