"""`specsot_cpu` for an EAGLE-style draft model: the multi-step draft-decode backend, the
draft-extend backend, and the `DraftBackendFactory` hook that offers them to SGLang.

`EagleDraftWorker.draft_forward` (sglang/srt/speculative/eagle_worker_v2.py:742-923) runs
`num_steps - 1` DECODE forwards of `bs * topk` rows, step i through
`draft_attn_backend.attn_backends[i]`, after one `draft_attn_backend.init_forward_metadata`.
The draft slots were taken from `req_to_token[r, seq_len : seq_len + topk * num_steps]`,
branch-major (`assign_draft_cache_locs_contiguous`, kernels/ops/speculative/cache_locs.py:42-124),
and step i of row (request b, branch t) reads what the Triton backend's
`generate_draft_decode_kv_indices` (cache_locs.py:161-309) gives it: the committed prefix
`req_to_token[r, :seq_len]`, then branch t's own slots for steps 0..i. Branches are columns:
like the GPU backends, a branch does not follow its tree parent's column after re-ranking.
"""

from __future__ import annotations

import functools

import torch

from sglang_specsot.cpu.attention import BACKEND_NAME, RowsAttn, SpecSoTCpuAttnBackend


def draft_branch_starts(seq_len: int, topk: int, num_steps: int) -> list[int]:
    """Column in `req_to_token` of each branch's first draft slot (cache_locs.py:262-270)."""
    return [seq_len + t * num_steps for t in range(topk)]


def plan_draft_decode(
    forward_batch, req_to_token: torch.Tensor, topk: int, num_steps: int
) -> list[list[RowsAttn]]:
    """One plan per draft step; row b * topk + t is request b's branch t."""
    seq_lens = forward_batch.seq_lens.tolist()
    req_pool = forward_batch.req_pool_indices.tolist()
    plans: list[list[RowsAttn]] = [[] for _ in range(num_steps - 1)]
    for b, (req, seq_len) in enumerate(zip(req_pool, seq_lens)):
        prefix = req_to_token[req, :seq_len]
        for t, start in enumerate(draft_branch_starts(seq_len, topk, num_steps)):
            branch = req_to_token[req, start : start + num_steps - 1]
            slots = torch.cat((prefix, branch)).to(torch.int64)
            for step, plan in enumerate(plans):
                plan.append(RowsAttn(b * topk + t, 1, slots[: seq_len + step + 1], None))
    return plans


class SpecSoTCpuDraftStepBackend(SpecSoTCpuAttnBackend):
    """One draft-decode step; its plan comes from `SpecSoTCpuMultiStepDraftBackend`."""

    def init_forward_metadata(self, forward_batch):
        raise AssertionError(
            "a draft step backend is planned by SpecSoTCpuMultiStepDraftBackend."
            "init_forward_metadata, not per step"
        )

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        assert self.rows_plan is not None, "draft step run before its multi-step plan was built"
        if layer.sliding_window_size is not None and layer.sliding_window_size >= 0:
            raise NotImplementedError(f"{BACKEND_NAME}: draft decode with sliding-window layers")
        return self.forward_planned(q, k, v, layer, forward_batch, save_kv_cache)


class SpecSoTCpuMultiStepDraftBackend:
    """Per-step draft-decode backends for `--speculative-num-steps` > 1, any topk."""

    # Each draft is planned when it starts (init_forward_metadata), for the chain length set
    # then, so a draft may run fewer steps: the SPECSOT draft model reads this
    # (speculative/model_draft.py `variable_steps`), which does not import this package.
    plans_each_draft = True

    def __init__(self, model_runner, topk: int, speculative_num_steps: int):
        _refuse_draft_window(model_runner)
        page_size = getattr(model_runner, "page_size", None) or 1
        if topk > 1 and page_size > 1:
            # SGLang rejects this pair for any backend but flashinfer/fa3/triton already
            # (arg_groups/speculative_hook.py:1271-1282): branches get page-aligned regions.
            raise NotImplementedError(
                f"{BACKEND_NAME}: --speculative-eagle-topk {topk} needs --page-size 1, "
                f"got {page_size}"
            )
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.attn_backends: list[SpecSoTCpuDraftStepBackend] = [
            SpecSoTCpuDraftStepBackend(model_runner) for _ in range(speculative_num_steps - 1)
        ]

    def init_forward_metadata(self, forward_batch) -> None:
        if forward_batch.forward_mode.is_idle():
            plans = [[] for _ in self.attn_backends]
        else:
            plans = plan_draft_decode(
                forward_batch,
                self.req_to_token_pool.req_to_token,
                self.topk,
                self.speculative_num_steps,
            )
        for backend, plan in zip(self.attn_backends, plans):
            backend.rows_plan = plan


def _refuse_draft_window(model_runner) -> None:
    if getattr(model_runner, "server_args", None) is None:
        return  # a hand-built runner (unit tests) has no server args to read
    from sglang.srt.speculative.spec_utils import resolve_draft_decode_window

    window, _ = resolve_draft_decode_window(model_runner)
    if window > 0:
        raise NotImplementedError(
            f"{BACKEND_NAME} does not implement --speculative-draft-window-size "
            f"(got {window}); unset it"
        )


# --- DraftBackendFactory ---------------------------------------------------------------------


def create_draft_decode_backend(factory) -> tuple[str, SpecSoTCpuMultiStepDraftBackend]:
    backend = SpecSoTCpuMultiStepDraftBackend(
        factory.draft_model_runner, factory.topk, factory.speculative_num_steps
    )
    return BACKEND_NAME, backend


def create_draft_extend_backend(factory) -> tuple[str, SpecSoTCpuAttnBackend]:
    return BACKEND_NAME, SpecSoTCpuAttnBackend(factory.draft_model_runner)


def draft_backend_factory_around(
    original, factory, backend_name, backend_map, error_template, stamps_children=False
):
    """AROUND hook on `DraftBackendFactory._create_backend` (draft_utils.py:47-82).

    Adds `specsot_cpu` to the hard-coded backend map the caller built: the decode map when
    `stamps_children` (only `create_decode_backend` passes it: its backend is a per-step
    container), else the draft-extend map. Every other backend name goes through untouched.
    """
    make = create_draft_decode_backend if stamps_children else create_draft_extend_backend
    backend_map = {**backend_map, BACKEND_NAME: functools.partial(make, factory)}
    return original(factory, backend_name, backend_map, error_template, stamps_children)
