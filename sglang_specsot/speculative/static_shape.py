"""The CPU twin of replaying SPECSOT's verify graphs: every verify through static buffers.

A CUDA graph reads its inputs from buffers fixed at capture, at the captured batch size and
width; SGLang's replay copies a batch in, pads it (decode_cuda_graph_runner.py:170-232, the
input buffers' padding policy) and slices the output. What can go wrong there is invisible to
an eager CPU forward: a stale row read because a copy missed it, a padded request that
attends where it should not, a width that is not a captured tier. This twin runs each verify
the way a replay feeds it, on the CPU: the tier's preallocated buffers are filled with garbage,
the batch is copied in, padded to the next captured batch size as SGLang pads (padded rows:
pool row 0, KV slot 0, `seq_len_fill_value`), the eager forward runs on the buffers, and the
output is cut to the real rows. SGLang's width rule decides whether a step "replays"
(`can_run_graph`: the batch's `num_tokens_per_req` must equal the captured width, and the batch
must fit the largest captured size); a step that does not is counted as eager, as on a GPU.

Greedy parity against plain decoding through this twin (tests: `-k "static_shape or tier"`) is
what shows that tier padding and batch padding leave every real row's tokens unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import torch

from sglang_specsot.host import adapter as sgl
from sglang_specsot.speculative.policy.tiers import TierCounts, VerifyTiers
from sglang_specsot.speculative.tree_masks import TreeMaskLayout, tree_mask_layout

STATIC_SHAPE_ENV = "SGLANG_SPECSOT_STATIC_SHAPE"  # "1": verify through the twin (CPU servers, tests)
# SGLang's default decode capture sizes (cuda_graph_config.py), up to a server's running requests.
CAPTURE_BS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64)
_GARBAGE_SEED = 20261129
# The padded length Triton and FlashInfer, the backends SPECSOT verifies with on CUDA, give a
# padded request (triton_backend.py:1440, flashinfer_backend.py:1353).
TREE_BACKENDS_FILL = 1


def static_shape_requested() -> bool:
    """Whether SGLANG_SPECSOT_STATIC_SHAPE asks for the twin; a ValueError names the values."""
    value = os.environ.get(STATIC_SHAPE_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{STATIC_SHAPE_ENV}={value!r}: set it to 1 (verify through the static-shape twin) or 0")
    return value == "1"


@dataclasses.dataclass(frozen=True)
class TierBuffers:
    """One tier's static inputs, sized for the largest captured batch."""

    width: int
    input_ids: torch.Tensor  # shape: (max_bs * width,), int64
    positions: torch.Tensor  # shape: (max_bs * width,), int64
    out_cache_loc: torch.Tensor  # shape: (max_bs * width,), int64
    seq_lens: torch.Tensor  # shape: (max_bs,), int64
    req_pool_indices: torch.Tensor  # shape: (max_bs,), int64
    custom_mask: torch.Tensor  # shape: (mask rows,), bool; QLEN_ONLY or FULL as the backend reads

    @classmethod
    def allocate(cls, width: int, max_bs: int, mask_numel: int) -> TierBuffers:
        rows, ids = max_bs * width, functools.partial(torch.empty, dtype=torch.int64)
        return cls(
            width=width, input_ids=ids(rows), positions=ids(rows), out_cache_loc=ids(rows), seq_lens=ids(max_bs),
            req_pool_indices=ids(max_bs), custom_mask=torch.empty(mask_numel, dtype=torch.bool),
        )  # fmt: skip

    def fill_garbage(self, generator: torch.Generator) -> None:
        """Stale contents, as a replay finds them: in range, so a row the copy missed gives
        wrong tokens rather than an index error."""
        for buf in (self.input_ids, self.positions, self.out_cache_loc, self.seq_lens, self.req_pool_indices):
            buf.copy_(torch.randint(1, 7, buf.shape, generator=generator, dtype=buf.dtype))
        self.custom_mask.copy_(torch.randint(0, 2, self.custom_mask.shape, generator=generator).bool())


class StaticShapeVerify:
    """Verify through per-tier static buffers, padded as SGLang's graph replay pads."""

    def __init__(self, tiers: VerifyTiers, capture_bs: tuple[int, ...], layout: TreeMaskLayout,
                 context_len: int, model_runner):  # fmt: skip
        self.tiers, self.capture_bs, self.layout = tiers, capture_bs, layout
        self.context_len = context_len
        self.model_runner = model_runner
        self.counts = TierCounts()
        self._generator = torch.Generator().manual_seed(_GARBAGE_SEED)
        self.buffers: dict[int, TierBuffers] = {}  # every tier's, allocated before the first verify
        self.fill = TREE_BACKENDS_FILL  # the attention backend's padded length, read with the buffers

    @classmethod
    def for_model_runner(cls, model_runner, tiers: VerifyTiers, max_running_requests: int | None) -> StaticShapeVerify:
        # As SGLang's capture sizes: none above the server's running requests (where known).
        limit = max(max_running_requests or CAPTURE_BS[-1], 1)
        capture_bs = tuple(b for b in CAPTURE_BS if b <= limit) or (1,)
        return cls(tiers, capture_bs, tree_mask_layout(model_runner.device), model_runner.model_config.context_len,
                   model_runner)  # fmt: skip

    def _allocate(self) -> None:
        """Every tier's buffers at once, as a capture would: the attention backend exists only
        once the scheduler has built the pools, after the worker."""
        try:
            self.fill = self.model_runner.attn_backend.get_cuda_graph_seq_len_fill_value()
        except NotImplementedError:  # a backend that captures no graph (the CPU's)
            self.fill = TREE_BACKENDS_FILL
        max_bs = self.capture_bs[-1]
        for w in self.tiers.widths:
            mask = self._mask_numel(max_bs, w, self.context_len)
            self.buffers[w] = TierBuffers.allocate(w, max_bs, mask)

    def _mask_numel(self, bs: int, width: int, context_len: int) -> int:
        if self.layout == TreeMaskLayout.QLEN_ONLY:
            return bs * width * width
        return bs * width * (context_len + width)  # FULL: each request's rows span its prefix

    # -- SGLang's rule, and the replay ---------------------------------------------------

    def can_run(self, forward_batch) -> bool:
        """decode_cuda_graph_runner.py:861-894 as it applies here: the batch's rows per
        request equal a captured tier's width, and the batch fits the largest capture."""
        spec_info = forward_batch.spec_info
        return (
            spec_info.num_tokens_per_req in self.tiers.widths
            and forward_batch.batch_size <= self.capture_bs[-1]
            and not forward_batch.return_logprob
        )

    def forward(self, target_worker, batch, width: int, pp_proxy_tensors=None):
        if not self.buffers:
            self._allocate()
        forward_batch = sgl.new_forward_batch(batch, self.model_runner)
        if not self.can_run(forward_batch):
            self.counts.count(width, replayed=False)
            return target_worker.forward_batch_generation(None, forward_batch=forward_batch, is_verify=True)
        padded, rows = self._replay_batch(forward_batch)
        target = target_worker.forward_batch_generation(None, forward_batch=padded, is_verify=True)
        _cut_rows(target.logits_output, rows)
        target.can_run_cuda_graph = True
        self.counts.count(width, replayed=True)
        return target

    def _replay_batch(self, fb):
        """`fb` copied into its tier's garbage-filled buffers, padded to a captured size."""
        n, bs = fb.spec_info.num_tokens_per_req, fb.batch_size
        pbs = next(b for b in self.capture_bs if b >= bs)
        buf = self.buffers[n]
        buf.fill_garbage(self._generator)
        rows, prows = bs * n, pbs * n
        buf.input_ids[:rows].copy_(fb.input_ids)
        buf.positions[:rows].copy_(fb.positions)
        buf.out_cache_loc[:rows].copy_(fb.out_cache_loc)
        buf.seq_lens[:bs].copy_(fb.seq_lens)
        buf.req_pool_indices[:bs].copy_(fb.req_pool_indices)
        # Padded requests, as SGLang pads them: pool row 0, KV slot 0 (reserved), fill length.
        for tensor in (buf.input_ids[rows:prows], buf.positions[rows:prows], buf.out_cache_loc[rows:prows], buf.req_pool_indices[bs:pbs]):  # fmt: skip
            tensor.zero_()
        buf.seq_lens[bs:pbs].fill_(self.fill)
        mask = self._padded_mask(buf, fb.spec_info.custom_mask, n, bs, pbs, fb.seq_lens)
        spec_info = dataclasses.replace(
            fb.spec_info, custom_mask=mask, draft_token=buf.input_ids[:prows], positions=buf.positions[:prows]
        )  # fmt: skip
        seq_lens_cpu = buf.seq_lens[:pbs].clone()
        padded = dataclasses.replace(
            fb, batch_size=pbs, input_ids=buf.input_ids[:prows], positions=buf.positions[:prows],
            out_cache_loc=buf.out_cache_loc[:prows], seq_lens=buf.seq_lens[:pbs], orig_seq_lens=buf.seq_lens[:pbs],
            seq_lens_cpu=seq_lens_cpu, req_pool_indices=buf.req_pool_indices[:pbs], spec_info=spec_info,
            seq_lens_sum=int(seq_lens_cpu.sum()),
        )  # fmt: skip
        return padded, rows

    def _padded_mask(self, buf: TierBuffers, mask: torch.Tensor, n: int, bs: int, pbs: int, seq_lens) -> torch.Tensor:
        """The real requests' mask, then each padded request's: a causal chain, since this
        backend checks every request's mask (on a GPU a padded request reads stale bits)."""
        chain = torch.ones(n, n, dtype=torch.bool).tril()
        real = mask.numel()
        if self.layout == TreeMaskLayout.FULL:
            real = int(seq_lens.sum()) * n + bs * n * n  # the FULL mask may be sized from a bound
            pad = torch.cat([torch.ones(n, self.fill, dtype=torch.bool), chain], dim=1).flatten()
        else:
            pad = chain.flatten()
        buf.custom_mask[:real].copy_(mask[:real])
        for i in range(pbs - bs):
            buf.custom_mask[real + i * pad.numel() : real + (i + 1) * pad.numel()].copy_(pad)
        return buf.custom_mask[: real + (pbs - bs) * pad.numel()]

    def tier_backend(self, width: int) -> None:
        """No tier has an attention backend of its own: the twin stands in for the graphs,
        and the model runner's backend serves every width."""
        return None

    def info(self) -> dict:
        return {
            "graphs": "static_shape_twin", "tiers": list(self.tiers.widths), "capture_bs": list(self.capture_bs),
            **self.counts.info(),
        }  # fmt: skip


def _cut_rows(logits_output, rows: int) -> None:
    """The output's per-token tensors cut to the real rows (SGLang's replay slices the same)."""
    for name in ("next_token_logits", "hidden_states", "next_token_logprobs"):
        value = getattr(logits_output, name, None)
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] > rows:
            setattr(logits_output, name, value[:rows])
