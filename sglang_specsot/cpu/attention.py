"""`specsot_cpu`: SGLang's `torch_native` attention, extended to speculative decoding on a CPU.

`TorchNativeAttnBackend` (sglang/srt/layers/attention/torch_native_backend.py) reads nothing
from `spec_info`: in TARGET_VERIFY it finds no extend lengths, a `seq_lens` without the draft
window and no tree mask, so it cannot verify. This subclass keeps its KV writes and its
numerics, and runs every mode's attention (decode, extend, verify, draft extend) as a
per-request SDPA over exactly the rows that are new, under an explicit mask, from a plan built
once per forward rather than in every layer:

    row i of request r sees  [prefix of r]  +  [window columns allowed by the causal / tree mask]

Numerics follow torch_native on purpose: K/V are always read back from the KV cache (float16 by
default on CPU, even for float32 weights) and cast to the query dtype, so a verify forward sees
the same rounded K/V a decode forward sees, and greedy verify agrees with greedy decode.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

logger = logging.getLogger(__name__)

BACKEND_NAME = "specsot_cpu"


@dataclass(frozen=True, slots=True)
class RowsAttn:
    """The attention of one request's query rows, planned once per forward for every layer."""

    q_start: int  # first row of this request in the batch's query tensor
    q_len: int
    kv_index: torch.Tensor  # shape (kv_len,), int64: KV-pool slots, in sequence order
    mask: torch.Tensor | None  # shape (q_len, kv_len), bool, True = visible; None = all visible
    causal: bool = False  # q_len == kv_len and plain causal: SDPA's own is_causal


# --- masks ---------------------------------------------------------------------------------


def prefix_causal_mask(prefix_len: int, q_len: int, device=None) -> torch.Tensor:
    """(q_len, prefix_len + q_len) bool: row i sees the prefix and new rows 0..i."""
    cols = torch.arange(prefix_len + q_len, device=device)
    rows = torch.arange(q_len, device=device)
    return cols.unsqueeze(0) <= (rows.unsqueeze(1) + prefix_len)


def verify_window_masks(
    custom_mask: torch.Tensor, seq_lens: list[int], num_draft_tokens: int
) -> list[torch.Tensor]:
    """Each request's (N, N) tree mask from a verify input's flat `custom_mask`.

    Two layouts reach a CPU backend (sglang/srt/speculative/eagle_utils.py:138-234):
    QLEN_ONLY, the CPU default (`default_tree_mask_mode`), is `bs` blocks of N*N; FULL_MASK is,
    per request, N rows of `seq_len + N` columns whose last N are the tree. NGRAM on CPU builds
    QLEN_ONLY as well (ngram_worker.py:326,355).
    """
    n, bs = num_draft_tokens, len(seq_lens)
    if custom_mask.dtype != torch.bool:
        raise NotImplementedError(
            f"{BACKEND_NAME}: tree mask of dtype {custom_mask.dtype} (a bit-packed layout?) is "
            "not supported; SGLang builds a bool QLEN_ONLY mask on CPU"
        )
    flat = custom_mask.reshape(-1)
    if flat.numel() == bs * n * n:
        return list(flat.view(bs, n, n).unbind(0))
    full = sum(seq_lens) * n + bs * n * n
    if flat.numel() >= full:  # a FULL_MASK buffer may be sized from an upper bound
        masks, offset = [], 0
        for seq_len in seq_lens:
            rows = flat[offset : offset + n * (seq_len + n)].view(n, seq_len + n)
            # The prefix columns are read as a mask by Triton's extend kernel (extend_attention.py
            # 740-751) but not by this backend: a FULL mask must leave them all True.
            if not bool(rows[:, :seq_len].all()):
                raise ValueError(f"{BACKEND_NAME}: a FULL_MASK tree mask hides prefix tokens (seq_len={seq_len})")
            masks.append(rows[:, seq_len:])
            offset += n * (seq_len + n)
        return masks
    raise ValueError(
        f"{BACKEND_NAME}: custom_mask has {flat.numel()} elements, which fits neither the "
        f"QLEN_ONLY layout ({bs}*{n}*{n}) nor the FULL_MASK layout ({full}) for seq_lens={seq_lens}"
    )


# --- plans ---------------------------------------------------------------------------------


def _kv_slots(req_to_token: torch.Tensor, req_pool_idx: int, kv_len: int) -> torch.Tensor:
    return req_to_token[req_pool_idx, :kv_len].to(torch.int64)


def plan_decode(forward_batch: ForwardBatch, req_to_token: torch.Tensor) -> list[RowsAttn]:
    """DECODE: one row per request, seeing its whole sequence (the new token's slot included).

    torch_native builds these slot lists in every layer (`_run_sdpa_forward_decode` indexes
    `seq_lens`, `req_pool_indices` and `req_to_token` per request per layer); a plan builds
    them once per forward."""
    seq_lens = forward_batch.seq_lens.tolist()
    req_pool = forward_batch.req_pool_indices.tolist()
    return [
        RowsAttn(i, 1, _kv_slots(req_to_token, req, seq_len), None)
        for i, (req, seq_len) in enumerate(zip(req_pool, seq_lens))
    ]


def plan_extend(forward_batch: ForwardBatch, req_to_token: torch.Tensor) -> list[RowsAttn]:
    """EXTEND / MIXED / DRAFT_EXTEND_V2: new rows are causal after a fully visible prefix."""
    prefix_lens = _as_list(forward_batch.extend_prefix_lens_cpu, forward_batch.extend_prefix_lens)
    extend_lens = _as_list(forward_batch.extend_seq_lens_cpu, forward_batch.extend_seq_lens)
    seq_lens = forward_batch.seq_lens.tolist()
    req_pool = forward_batch.req_pool_indices.tolist()
    plan, q_start = [], 0
    for req, prefix, q_len, kv_len in zip(req_pool, prefix_lens, extend_lens, seq_lens):
        assert prefix + q_len == kv_len, (
            f"{BACKEND_NAME}: extend layout mismatch in {forward_batch.forward_mode.name}: "
            f"prefix {prefix} + extend {q_len} != seq_len {kv_len}"
        )
        mask = None if prefix == 0 else prefix_causal_mask(prefix, q_len, req_to_token.device)
        plan.append(
            RowsAttn(q_start, q_len, _kv_slots(req_to_token, req, kv_len), mask, prefix == 0)
        )
        q_start += q_len
    return plan


def plan_target_verify(forward_batch: ForwardBatch, req_to_token: torch.Tensor) -> list[RowsAttn]:
    """TARGET_VERIFY: N draft rows per request after the committed `seq_lens` prefix.

    `seq_lens` excludes the window (the verify writes `req_to_token[r, seq_len:seq_len+N]`,
    eagle_utils.py:305-414, ngram_worker.py:365-373). A chain (`tree_topk == 1`, or no mask) is
    causal inside the window; a tree (EAGLE topk > 1, NGRAM's `tree_topk == -1`) uses the mask.
    """
    spec_info = forward_batch.spec_info
    n = spec_info.draft_token_num
    seq_lens = forward_batch.seq_lens.tolist()
    req_pool = forward_batch.req_pool_indices.tolist()
    custom_mask = getattr(spec_info, "custom_mask", None)
    is_chain = custom_mask is None or getattr(spec_info, "tree_topk", None) == 1
    windows = None if is_chain else verify_window_masks(custom_mask, seq_lens, n)
    plan = []
    for i, (req, seq_len) in enumerate(zip(req_pool, seq_lens)):
        if windows is None:
            mask = prefix_causal_mask(seq_len, n, req_to_token.device)
        else:
            prefix = torch.ones((n, seq_len), dtype=torch.bool, device=req_to_token.device)
            mask = torch.cat((prefix, windows[i].to(req_to_token.device)), dim=1)
        plan.append(RowsAttn(i * n, n, _kv_slots(req_to_token, req, seq_len + n), mask))
    return plan


def _as_list(cpu_list: list[int] | None, tensor: torch.Tensor) -> list[int]:
    return list(cpu_list) if cpu_list is not None else tensor.tolist()


# --- the backend ---------------------------------------------------------------------------


class SpecSoTCpuAttnBackend(TorchNativeAttnBackend):
    """torch_native plus TARGET_VERIFY (chain and tree), DRAFT_EXTEND_V2 and draft decode."""

    # An extend writes every row's K/V before any row attends (forward_planned), so requests
    # that share a prefix may be extended in one pass: the SPECSOT draft model's catch-up
    # reads this (speculative/drafters/model_extend.py), which does not import this package.
    extend_writes_kv_first = True

    def __init__(self, model_runner):
        super().__init__(model_runner)
        translator = getattr(model_runner, "kv_index_translator", None)
        if translator is not None and translator.is_translating:
            raise NotImplementedError(
                f"{BACKEND_NAME} reads req_to_token as physical KV slots; the unified KV pool "
                "(virtual ids) is not supported. Drop --enable-unified-memory."
            )
        self.rows_plan: list[RowsAttn] | None = None  # set by init_forward_metadata

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        super().init_forward_metadata(forward_batch)
        mode = forward_batch.forward_mode
        req_to_token = self.req_to_token_pool.req_to_token
        if mode.is_idle() or forward_batch.encoder_lens is not None:
            self.rows_plan = None  # torch_native's: encoder-decoder models
        elif mode.is_decode():
            self.rows_plan = plan_decode(forward_batch, req_to_token)
        elif mode.is_target_verify():
            self.rows_plan = plan_target_verify(forward_batch, req_to_token)
        else:
            self.rows_plan = plan_extend(forward_batch, req_to_token)

    def forward_extend(self, q, k, v, layer: RadixAttention, forward_batch, save_kv_cache=True):
        if not _is_plain_decoder_layer(layer, forward_batch):
            if forward_batch.forward_mode.is_extend_without_speculative():
                return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
            raise NotImplementedError(
                f"{BACKEND_NAME}: {forward_batch.forward_mode.name} with cross-attention, "
                "encoder-only or sliding-window layers is not supported"
            )
        assert self.rows_plan is not None, "forward_extend before init_forward_metadata"
        return self.forward_planned(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_decode(self, q, k, v, layer: RadixAttention, forward_batch, save_kv_cache=True):
        # torch_native's numerics (the same gathered K/V, cast, SDPA), from the forward's plan.
        if self.rows_plan is None or not _is_plain_decoder_layer(layer, forward_batch):
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        return self.forward_planned(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_planned(self, q, k, v, layer: RadixAttention, forward_batch, save_kv_cache=True):
        """Every mode's attention once planned: this forward's K/V into the pool (where the
        layer asks), then each request's rows over its planned slots."""
        if save_kv_cache and k is not None and v is not None:
            self._write_kv(layer, forward_batch, k, v)
        return self.attend_rows(q, layer, self.rows_plan)

    def _write_kv(self, layer, forward_batch, k, v) -> None:
        loc = KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc)
        self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)

    def attend_rows(self, q: torch.Tensor, layer: RadixAttention, plan: list[RowsAttn]):
        """SDPA per request over its planned KV slots; returns (num_rows, heads * v_head_dim)."""
        num_heads, v_dim = layer.tp_q_head_num, layer.v_head_dim
        q_ = q.reshape(-1, num_heads, layer.qk_head_dim)
        o = q_.new_empty((q_.shape[0], num_heads, v_dim))
        k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        gqa = layer.tp_q_head_num != layer.tp_k_head_num
        for rows in plan:
            q_rows = q_[rows.q_start : rows.q_start + rows.q_len].transpose(0, 1)
            # Through the cache, cast like torch_native: verify and decode see equal K/V.
            # index_select, not k_cache[kv_index]: the same rows, without advanced
            # indexing's general path, which costs several times more per small gather.
            key = k_cache.index_select(0, rows.kv_index).to(q.dtype).transpose(0, 1)
            value = v_cache.index_select(0, rows.kv_index).to(q.dtype).transpose(0, 1)
            out = scaled_dot_product_attention(
                q_rows.unsqueeze(0),
                key.unsqueeze(0),
                value.unsqueeze(0),
                attn_mask=rows.mask,
                is_causal=rows.causal,
                scale=layer.scaling,
                enable_gqa=gqa,
            )
            o[rows.q_start : rows.q_start + rows.q_len] = out.squeeze(0).transpose(0, 1)
        return o.view(-1, num_heads * v_dim)


def _is_plain_decoder_layer(layer: RadixAttention, forward_batch: ForwardBatch) -> bool:
    return (
        not layer.is_cross_attention
        and layer.attn_type != AttentionType.ENCODER_ONLY
        and (layer.sliding_window_size is None or layer.sliding_window_size < 0)
        and forward_batch.encoder_lens is None
    )


# --- registration --------------------------------------------------------------------------


def create_specsot_cpu_backend(model_runner) -> SpecSoTCpuAttnBackend:
    return SpecSoTCpuAttnBackend(model_runner)


def register_cpu_attention_backend() -> None:
    """Make `--attention-backend specsot_cpu` a choice and a registered backend. Idempotent.

    Must run before argparse (the plugin's `register()` does, launch_server.py:79) and in every
    process that builds a model runner (the plugin runs in each scheduler, scheduler.py:6323).
    """
    from sglang.srt.arg_groups.choices import (
        ATTENTION_BACKEND_CHOICES,
        add_attention_backend_choices,
    )
    from sglang.srt.layers.attention.attention_registry import (
        ATTENTION_BACKENDS,
        register_attention_backend,
    )

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    if ATTENTION_BACKENDS.get(BACKEND_NAME) is not create_specsot_cpu_backend:
        register_attention_backend(BACKEND_NAME)(create_specsot_cpu_backend)
