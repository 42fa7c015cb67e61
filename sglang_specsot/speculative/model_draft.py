"""Drafting with `--speculative-draft-model-path`, SGLang's way: a draft model or an EAGLE head.

`SoTDraftModel` subclasses SGLang's `StandaloneDraftWorker` (the draft side of STANDALONE):
its own `TpModelWorker` for the draft LM sharing the target's `req_to_token_pool` and slot
allocator, multi-step draft decode (a chain for top-k 1, a tree for top-k > 1) and
draft-extend over the verify window. `SoTEagleHead` subclasses SGLang's `EagleDraftWorker`
(the draft side of EAGLE and EAGLE3): the same stages, over the target's embedding and the
hidden states its prefill and verify captured. What `DraftSeams` adds to either is the seam
SPECSOT needs: the draft tree comes back as host `DraftTree`s, so the SoT-context candidates
can be merged into it before one verify, and draft-extend runs over a verify window that may
be wider than the draft's own tree.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass, field

import torch

from sglang_specsot.host import adapter as sgl
from sglang_specsot.speculative.policy.chains import ChainStop
from sglang_specsot.speculative.draft_tree import DraftTree, TreeBuilder
from sglang_specsot.speculative.draft_kv import range_slots
from sglang_specsot.speculative.token_map import check_token_map

logger = logging.getLogger(__name__)

# What a catch-up (extend_ranges) lays out anew on a decode batch, restored after it.
_EXTEND_FIELDS = (
    "seq_lens", "seq_lens_cpu", "seq_lens_sum", "orig_seq_lens", "out_cache_loc", "input_ids", "forward_mode",
    "spec_info", "prefix_lens", "extend_lens", "extend_num_tokens", "extend_logprob_start_lens", "return_logprob",
)  # fmt: skip


def model_tree_size(num_steps: int, topk: int, num_draft_tokens: int) -> int:
    """Nodes (incl. the root) the draft model proposes per request; the rest of the verify
    window (`num_draft_tokens` in all) is for SoT-context candidates."""
    return min(num_draft_tokens, 1 + num_steps * topk)


class DraftSeams:
    """What SPECSOT adds to an SGLang draft worker (mixed in before it): `model_tree_size`
    nodes per request as host trees, chains cut by the budget policy, draft-extend over the
    step's verify window, the draft's own confidence."""

    # Whether draft-extend reads the target's hidden states of the same step (an EAGLE head):
    # the target then captures them, and the extend cannot be deferred past its step.
    reads_target_hidden = False
    # Set by the worker whose chains take runner-ups (AdaptiveConfig.runner_ups): each extend
    # and draft forward then keeps its rows' second choice.
    runner_ups: RunnerUps | None = None
    # The draft head's rows as target token ids (--speculative-token-map, or an EAGLE-3
    # head's own hot vocabulary); None: the whole vocabulary. SGLang's draft forwards read it
    # under this name.
    hot_token_id: torch.Tensor | None = None

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker):
        spec = sgl.get_spec()
        self.tree_size = model_tree_size(
            spec.speculative_num_steps, spec.speculative_eagle_topk, spec.speculative_num_draft_tokens
        )
        self.verify_width = spec.speculative_num_draft_tokens
        self.max_steps = spec.speculative_num_steps
        self.confidence = False  # set by the worker whose budget policy reads it
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        # SGLang reads speculative_num_draft_tokens both as the draft tree size (draft,
        # organize_draft_results) and as the draft-extend window (= the verify window).
        # Between steps it holds the full window, so draft-extend graphs are captured for
        # it; each stage sets its own width for its duration (_width), the way SGLang's
        # own adaptive speculation rewrites it (eagle_worker_v2.py:1937).
        self.speculative_num_draft_tokens = self.verify_width
        # The per-decode KV reservation needs nothing from us: SGLang sizes it from the
        # published spec config (get_alloc_len_per_decode, allocation_sizing.py:28) as
        # max(steps * topk, num_draft_tokens): the verify window, or every draft-step slot.

    def token_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """Token ids of the draft head's output `rows` (themselves without a token map)."""
        return rows if self.hot_token_id is None else self.hot_token_id[rows.to(self.hot_token_id.device)]

    def rebuild_chain_buffers(self, rebuild) -> None:
        # SGLang's chain fast path assumes tree size == steps + 1; it holds for the draft
        # tree (of the current step count), which is all the chain buffers describe.
        steps = getattr(self, "speculative_num_steps", self.max_steps)
        with self._width(model_tree_size(steps, self.topk, self.verify_width)):
            rebuild()

    @contextlib.contextmanager
    def _width(self, n: int):
        """SGLang's `speculative_num_draft_tokens` set to `n` for the duration of one stage."""
        saved = getattr(self, "speculative_num_draft_tokens", self.verify_width)
        self.speculative_num_draft_tokens = n
        try:
            yield
        finally:
            self.speculative_num_draft_tokens = saved

    @contextlib.contextmanager
    def _steps(self, k: int):
        """SGLang's `speculative_num_steps` (and the draft backend's) set to `k` for one draft.

        The slots SGLang allocates, its tree build and our CPU draft backend's plan all read
        the step count at call time, so a shorter chain is consistent end to end.
        """
        backend = self.draft_attn_backend
        saved = self.speculative_num_steps, backend.speculative_num_steps
        self.speculative_num_steps = backend.speculative_num_steps = k
        if k != saved[0]:
            self.refresh_chain_buffers()
        try:
            yield
        finally:
            self.speculative_num_steps, backend.speculative_num_steps = saved
            if k != saved[0]:
                self.refresh_chain_buffers()

    @property
    def variable_steps(self) -> bool:
        """Whether a step may draft a shorter chain than --speculative-num-steps: with our CPU
        draft backend (planned per call) and no draft graphs (captured for the full chain)."""
        # Declared by the backend class (cpu/draft_attention.py's SpecSoTCpuMultiStepDraftBackend).
        return getattr(self.draft_attn_backend, "plans_each_draft", False) and not self.fixed_window

    @property
    def fixed_window(self) -> bool:
        """Whether draft-extend must always run over the full window: its CUDA graphs are
        captured for that width (eagle_draft_extend_cuda_graph_runner.py:319 falls back to
        eager otherwise). Without graphs (CPU) a step's window may be narrower."""
        return self.cuda_graph_runner_for_draft_extend is not None

    def draft_trees(self, batch, steps: int | None = None, stop: ChainStop | None = None) -> list[DraftTree]:
        """Run `steps` (default: all) draft-model steps from `batch.spec_info` (top-k of the
        last extend); step one reads that top-k, so each further step is one forward.

        With `stop` (a top-1 chain run eagerly), each forward's top-1 probabilities go to
        `stop.observe`, and from the second forward on, one runs only if `stop.go_on()`: the
        chains past that depth are padding, for the caller to cut (`stop.depths()`)."""
        steps = self.max_steps if steps is None else steps
        assert 1 <= steps <= self.max_steps, f"{steps} draft steps outside 1..{self.max_steps}"
        assert steps == self.max_steps or self.variable_steps, "this draft backend drafts full chains only"
        assert stop is None or (self.topk == 1 and self.variable_steps), "chains stop early on our eager CPU path only"
        size = model_tree_size(steps, self.topk, self.verify_width)
        if self.runner_ups is not None:
            self.runner_ups.by_forward.clear()
        if stop is not None:
            stoppable = sgl.stoppable_forwards(
                self.draft_runner, stop.go_on, lambda logits: stop.observe(self._seen(logits))
            )  # fmt: skip
        elif self.runner_ups is not None:  # every forward runs; each one's second choices are kept
            stoppable = sgl.stoppable_forwards(self.draft_runner, lambda: True, self._seen)
        else:
            stoppable = contextlib.nullcontext()
        with self._steps(steps), self._width(size), sgl.draft_model_context(self.parallel_layout), stoppable:
            verify_input = self.draft(batch)
        return read_trees(verify_input, len(batch.reqs))

    def _seen(self, logits: torch.Tensor) -> list[float]:
        """A draft forward's rows: the draft's probability of the token it drafts (its
        argmax), its runner-up kept where asked for."""
        top = torch.softmax(logits.float(), dim=-1).topk(2, dim=-1)
        if self.runner_ups is not None:
            seconds = self.token_ids(top.indices[:, 1]).tolist()
            self.runner_ups.by_forward.append(list(zip(seconds, top.values[:, 1].tolist())))
        return top.values[:, 0].tolist()

    @property
    def keeps_confidence(self) -> bool:
        """Whether draft-extends leave the draft's probability of its top-1 token in `topk_p`
        (SGLang's top-1 path leaves 1.0): asked for by the adaptive budget policy
        (`confidence`), for a top-1 chain run eagerly, without rejection sampling (whose
        top-k is a sample, with probabilities of its own)."""
        return (
            self.confidence and self.topk == 1 and self.variable_steps
            and not sgl.get_spec().speculative_use_rejection_sampling
        )  # fmt: skip

    def _draft_extend(self, batch, result) -> None:
        """SGLang's draft-extend over the window `result` describes; fills
        `result.next_draft_input` (with the draft's confidence where `keeps_confidence`)."""
        if not self.keeps_confidence:
            self.draft_extend_for_decode(batch, result)
            return
        with sgl.kept_forward_logits(self.draft_runner) as kept:
            self.draft_extend_for_decode(batch, result)
        draft_input = result.next_draft_input
        probs = torch.softmax(kept[-1].next_token_logits.float(), dim=-1)  # one row per request
        draft_input.topk_p = probs.gather(-1, draft_input.topk_index.to(probs.device))
        self._keep_first_runner_ups(batch, probs)

    def _keep_first_runner_ups(self, batch, probs: torch.Tensor) -> None:
        """After an extend (`probs`: one row per request of `batch`), each request's first
        two choices for its next draft, for that draft's runner-up (`RunnerUps.first`)."""
        if self.runner_ups is None:
            return
        assert probs.shape[0] == len(batch.reqs), f"{probs.shape[0]} extend rows for {len(batch.reqs)} requests"
        top = probs.topk(2, dim=-1)
        for req, (first, second), q in zip(batch.reqs, self.token_ids(top.indices).tolist(), top.values[:, 1].tolist()):
            self.runner_ups.first[req.rid] = (first, second, q)

    def extend_after_prefill(self, batch, next_token_ids: torch.Tensor, target_hidden: torch.Tensor | None = None):
        """Draft-extend over the prompt (with a head, over the target's `target_hidden`
        states of it); returns SGLang's draft input (top-k for step one)."""
        if self.runner_ups is None:
            with sgl.draft_model_context(self.parallel_layout):
                return self.draft_extend_for_prefill(batch, target_hidden, next_token_ids)
        with sgl.draft_model_context(self.parallel_layout), sgl.kept_forward_logits(self.draft_runner) as kept:
            first = self.draft_extend_for_prefill(batch, target_hidden, next_token_ids)
        self._keep_first_runner_ups(batch, torch.softmax(kept[-1].next_token_logits.float(), dim=-1))
        return first

    def extend_ranges(self, batch, ranges: list[tuple[int, int]], tokens: list[list[int]]):
        """Draft-extend over positions [start, end) of each request, all committed; returns the
        top-k (p, index) after each request's last position.

        This is SGLang's draft-extend of a prefill, over a batch laid out as the prefill of
        those positions (prefix `start`, extend `end - start`, logits at the last row only):
        it fills the draft's KV of deferred prompts and steps (ExtendBacklog). SGLang's
        standalone draft reads its input one token ahead (eagle_worker_v2.py:991): position p
        holds token p+1, so `tokens[i]` is t[start .. end] (end - start + 1 tokens), of which
        the last, t[end], is the prefill's "next token" (the bonus token at a request's end).
        """
        assert not self.reads_target_hidden, "a head's catch-up would need the target's hidden states of every position"
        assert all(e > s >= 0 for s, e in ranges), f"empty or negative range in {ranges}"
        assert all(len(t) == e - s + 1 for (s, e), t in zip(ranges, tokens)), "tokens must be t[start .. end]"
        device = batch.seq_lens.device
        starts = [s for s, _ in ranges]
        lens = [e - s for s, e in ranges]
        ends = torch.tensor([e for _, e in ranges], dtype=batch.seq_lens.dtype)
        saved = {name: getattr(batch, name) for name in _EXTEND_FIELDS}
        try:
            batch.forward_mode = sgl.ForwardMode.EXTEND
            batch.return_logprob = False
            batch.input_ids = torch.tensor([t for row in tokens for t in row[:-1]], dtype=torch.int64, device=device)
            batch.out_cache_loc = range_slots(
                batch.req_to_token_pool.req_to_token, batch.req_pool_indices.tolist(), ranges
            ).to(device)
            batch.seq_lens, batch.seq_lens_cpu = ends.to(device), ends
            batch.orig_seq_lens = ends.to(device=device, dtype=torch.int32)
            batch.seq_lens_sum = int(ends.sum())
            batch.prefix_lens, batch.extend_lens = starts, lens
            batch.extend_num_tokens = sum(lens)
            batch.extend_logprob_start_lens = lens
            tails = torch.tensor([row[-1] for row in tokens], dtype=torch.int64, device=device)
            first = self.extend_after_prefill(batch, tails)
        finally:
            for name, value in saved.items():
                setattr(batch, name, value)
        return first.topk_p, first.topk_index

    def extend_after_verify(self, batch, result) -> None:
        """Draft-extend over this step's verify window; fills `result.next_draft_input`. Where
        its graph is captured at the full window only (`fixed_window`), a narrower step's
        extend runs at the window too, so the graph replays instead of an eager forward."""
        width = result.speculative_num_draft_tokens
        assert 1 <= width <= self.verify_width, f"verify window {width} outside [1, {self.verify_width}]"
        if self.fixed_window and width < self.verify_width:
            self._extend_at_window(batch, result)
            return
        with self._width(width), sgl.draft_model_context(self.parallel_layout):
            self._draft_extend(batch, result)

    def _extend_at_window(self, batch, result) -> None:
        """The draft-extend of a step verified narrower than the window, run over the window as
        SGLang's always is: the rows past the step's own are its last token again, past every
        accept length, so they write draft KV only into the slots the step reserved beyond
        what it committed (SGLang's extend writes its rejected rows' there too) and never
        reach the next draft's input (`select_index` reads the last accepted row)."""
        window, bs = self.verify_width, len(batch.reqs)
        wide = widened_result(result, bs, window)
        saved = batch.out_cache_loc  # the verify's slots, `width` per request
        batch.out_cache_loc = sgl.assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices, req_to_token=batch.req_to_token_pool.req_to_token,
            start_offset=batch.seq_lens, end_offset=batch.seq_lens + window,
            batch_size=bs, draft_token_num=window, device=batch.seq_lens.device,
        )  # fmt: skip
        try:
            with self._width(window), sgl.draft_model_context(self.parallel_layout):
                self._draft_extend(batch, wide)
        finally:
            batch.out_cache_loc = saved
        result.next_draft_input = wide.next_draft_input


class SoTDraftModel(DraftSeams, sgl.DraftModelWorker):
    """SGLang's standalone draft worker (a whole draft LM), drafting `model_tree_size` nodes
    per request."""

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.hot_token_id = self._cut_head_to_token_map()

    def _cut_head_to_token_map(self) -> torch.Tensor | None:
        """With `--speculative-token-map`, the draft's LM head keeps only the map's rows
        (speculative/token_map.py); returns the map, which SGLang's draft forwards read
        (`hot_token_id`) to turn the head's row indices back into token ids.

        SGLang's STANDALONE loads the map but keeps the draft's own full head
        (`StandaloneDraftWorker.init_lm_head` is a no-op), so its row indices would be read as
        hot-map positions; here the head is cut before any forward, and before the int8 copy
        of the draft's weights (drafters/model.ModelDrafting), which then quantizes the cut head."""
        spec = sgl.get_spec()
        if spec.speculative_token_map is None:
            return None
        if spec.speculative_use_rejection_sampling:
            raise ValueError(
                "--speculative-token-map with --speculative-use-rejection-sampling: rejection sampling "
                "needs the draft's probabilities over the whole vocabulary; drop one of the two"
            )
        hot = sgl.load_token_map(spec.speculative_token_map)
        model = self.draft_runner.model
        check_token_map(hot, model.lm_head.weight.shape[0])
        logger.info(
            "SPECSOT draft LM head cut to %d of %d tokens by --speculative-token-map=%s",
            hot.numel(), model.lm_head.weight.shape[0], spec.speculative_token_map,
        )  # fmt: skip
        model.lm_head = hot_vocab_head(model.lm_head, hot)
        return hot.to(self.device)

    def init_token_map(self) -> None:
        # SGLang's (at pool allocation) would load the map again, onto the CPU: it is loaded,
        # on this worker's device, and the head cut, in __init__ (`_cut_head_to_token_map`).
        pass


class SoTEagleHead(DraftSeams, sgl.EagleHeadWorker):
    """SGLang's EAGLE V2 draft worker (an EAGLE or EAGLE-3 head), drafting `model_tree_size`
    nodes per request. SGLang shares the target's embedding (and, where the head asks, its LM
    head) and reads an EAGLE-3 head's hot vocabulary at pool allocation (`init_lm_head`)."""

    reads_target_hidden = True


def hot_vocab_head(head: torch.nn.Module, hot: torch.Tensor) -> torch.nn.Module:
    """A copy of the LM head `head` whose weight keeps only the rows `hot`: the same class,
    quant method and attributes, so SGLang's logits processor computes it as it computes
    `head`. A copy, not `head` cut in place: a model with tied embeddings (Qwen2.5-0.5B)
    embeds its input tokens with that same module."""
    cut = copy.copy(head)
    cut._parameters, cut._buffers, cut._modules = dict(head._parameters), dict(head._buffers), dict(head._modules)
    if getattr(head, "quant_method", None) is not None:  # its own: the int8 copy switches the cut head's class
        cut.quant_method = copy.copy(head.quant_method)
    cut.weight = torch.nn.Parameter(head.weight.data.index_select(0, hot.to(head.weight.device)), requires_grad=False)
    return cut


@dataclass
class RunnerUps:
    """The draft's second choices, kept for the chain's runner-ups (`with_runner_ups`).

    `first`: per request, after its last extend, (first choice, second choice, the
    draft's probability of the second): the chain's first draft is the first choice, which
    the worker checks before it takes the second. `by_forward`: per draft forward of the
    current chain, per row (second choice, its probability): forward i gives the second
    choice beside the chain's draft at depth i + 1."""

    first: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    by_forward: list[list[tuple[int, float]]] = field(default_factory=list)

    def forget(self, rid: str) -> None:
        self.first.pop(rid, None)


def widened_result(result, bs: int, window: int):
    """A copy of a verify's result as if it had verified `window` rows per request: each
    request's row padded with its last token, and (for a head) its target hidden states with
    their last row; accept lengths as they were. The original is untouched."""
    width = result.speculative_num_draft_tokens
    pad = window - width

    def widen(rows: torch.Tensor) -> torch.Tensor:  # shape: (bs * width, ...) -> (bs * window, ...)
        by_request = rows.view(bs, width, *rows.shape[1:])
        tail = by_request[:, -1:].expand(bs, pad, *rows.shape[1:])
        return torch.cat([by_request, tail], dim=1).reshape(bs * window, *rows.shape[1:])

    wide = copy.copy(result)
    wide.next_token_ids = widen(result.next_token_ids)
    wide.speculative_num_draft_tokens = window
    hidden = getattr(result.logits_output, "hidden_states", None)
    if hidden is not None:
        wide.logits_output = copy.copy(result.logits_output)
        wide.logits_output.hidden_states = widen(hidden)
    return wide


def read_trees(verify_input, bs: int) -> list[DraftTree]:
    """Host `DraftTree`s of SGLang's draft output: its tokens and links in one read, the one
    wait for the device a draft model adds to a step (and the read that waits for the last
    step's committed tokens too, `host_sync`)."""
    packed = torch.stack([
        verify_input.draft_token.view(bs, -1).to(torch.int64),
        verify_input.retrieve_next_token.view(bs, -1).to(torch.int64),
        verify_input.retrieve_next_sibling.view(bs, -1).to(torch.int64),
    ]).cpu()  # shape: (3, bs, n)
    return trees_from_links(packed[0], packed[1], packed[2])


def trees_from_links(
    tokens: torch.Tensor, next_token: torch.Tensor, next_sibling: torch.Tensor
) -> list[DraftTree]:
    """Host `DraftTree`s from SGLang's tree layout (build_tree_kernel_efficient's output).

    shapes: tokens, next_token, next_sibling (bs, n) int64; node 0 is the root; a node's
    first child is `next_token[node]`, that child's next sibling `next_sibling[child]`.
    """
    trees = []
    for row_tokens, row_next, row_sibling in zip(tokens.tolist(), next_token.tolist(), next_sibling.tolist()):
        builder = TreeBuilder(budget=len(row_tokens) - 1)
        stack = [(0, builder.add_node(row_tokens[0], -1))]  # (SGLang node, builder node)
        while stack:
            node, at = stack.pop()
            child = row_next[node]
            while child != -1:
                stack.append((child, builder.add_node(row_tokens[child], at)))
                child = row_sibling[child]
        trees.append(builder.to_bfs_tree())  # BFS: parents precede children, as verify needs
    return trees
