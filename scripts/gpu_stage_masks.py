"""Stage `masks` of the device check (scripts/gpu_stages.py): SPECSOT's tree masks through
SGLang's Triton extend kernel, against a float64 reference that a causal mask fails."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from gpu_random_qwen2 import stage_device
from gpu_record import Recorder


@dataclass(frozen=True)
class MaskPlan:
    heads: int = 12
    kv_heads: int = 2
    head_dim: int = 128
    n: int = 8  # draft tokens per request
    prefix_lens: tuple[int, ...] = (5, 37, 130)
    dtype: str = "bfloat16"
    tol: float = 2e-2  # max |kernel - float64 reference| allowed for this dtype


DEVICE_MASKS = MaskPlan()
SMOKE_MASKS = MaskPlan(heads=2, kv_heads=1, head_dim=16, prefix_lens=(3, 9), dtype="float32", tol=1e-4)


def _trees(n: int):
    """A branching tree, a padded small tree and a chain, each of `n` nodes (the branching
    one first, so it gets the shortest prefix, where a wrong mask shows most)."""
    from sglang_specsot.speculative.draft_tree import DraftTree, pad_tree

    assert n == 8, f"the check's trees have 8 nodes, got n={n}"
    chain = DraftTree(tuple(range(10, 18)), (-1, 0, 1, 2, 3, 4, 5, 6))
    branching = DraftTree(tuple(range(20, 28)), (-1, 0, 0, 1, 1, 2, 3, 5))
    small = pad_tree(DraftTree((30, 31, 32), (-1, 0, 0)), n, filler=0)
    return branching, small, chain


def qlen_mask_of(trees, n: int):
    """The worker's QLEN_ONLY mask: `tree_mask` rows of each request, flattened."""
    import torch

    from sglang_specsot.speculative.draft_tree import tree_mask

    return torch.tensor([tree_mask(t, n) for t in trees], dtype=torch.bool).flatten()


def _reference_attention(q, k, v, visible, scale):
    """float64 attention of q (n, H, D) over k, v (L, KH, D) where `visible` (n, L) allows."""
    import torch

    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@dataclass(frozen=True)
class MaskCase:
    """One verify window of `bs` requests laid out as SGLang's Triton backend hands it over."""

    q: object  # (bs * n, heads, head_dim)
    k: object  # (bs * n, kv_heads, head_dim): the window's keys
    v: object  # (bs * n, kv_heads, head_dim)
    k_buf: object  # (pool, kv_heads, head_dim): the KV pool the prefixes live in
    v_buf: object
    kv_indices: object  # (sum(prefix_lens),) int64: each request's prefix slots, in order
    kv_indptr: object  # (bs + 1,) int32
    qlen: object  # (bs * n * n,) bool: the worker's QLEN_ONLY tree mask


def mask_case(plan: MaskPlan, device) -> MaskCase:
    import torch

    n, bs, total = plan.n, len(plan.prefix_lens), sum(plan.prefix_lens)
    trees = [_trees(n)[i % 3] for i in range(bs)]
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(rows: int, heads: int):
        values = torch.randn(rows, heads, plan.head_dim, generator=g)
        return values.to(device=device, dtype=getattr(torch, plan.dtype))

    pool = total + 7  # prefix slots scattered through a pool, as the allocator leaves them
    return MaskCase(
        q=rand(bs * n, plan.heads), k=rand(bs * n, plan.kv_heads), v=rand(bs * n, plan.kv_heads),
        k_buf=rand(pool, plan.kv_heads), v_buf=rand(pool, plan.kv_heads),
        kv_indices=torch.randperm(pool, generator=g)[:total].to(device),
        kv_indptr=torch.tensor([0, *itertools.accumulate(plan.prefix_lens)], dtype=torch.int32, device=device),
        qlen=qlen_mask_of(trees, n).to(device),
    )  # fmt: skip


def kernel_output(case: MaskCase, plan: MaskPlan):
    """SGLang's Triton extend kernel over the case, reading our FULL-layout mask (tree_masks.py)."""
    import torch

    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    from sglang_specsot.speculative.tree_masks import full_layout_indptr, full_layout_mask

    n, bs = plan.n, len(plan.prefix_lens)
    prefix = torch.tensor(plan.prefix_lens, device=case.q.device)
    mask = full_layout_mask(case.qlen, prefix, n, sum(plan.prefix_lens))
    qo_indptr = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=case.q.device)
    o = torch.empty_like(case.q)
    extend_attention_fwd(case.q, case.k, case.v, o, case.k_buf, case.v_buf, qo_indptr, case.kv_indptr,
                         case.kv_indices, mask, True, full_layout_indptr(prefix, n), n, 1.0, 1.0,
                         sm_scale=plan.head_dim**-0.5)  # fmt: skip
    return o


def reference_errors(case: MaskCase, plan: MaskPlan, o) -> tuple[float, float]:
    """(max |o - tree reference|, max |causal reference - tree reference|) over the requests."""
    import torch

    n, bs, scale = plan.n, len(plan.prefix_lens), plan.head_dim**-0.5
    worst = teeth = 0.0
    for b, p in enumerate(plan.prefix_lens):
        rows = slice(b * n, (b + 1) * n)
        slots = case.kv_indices[case.kv_indptr[b] : case.kv_indptr[b + 1]]
        k, v = torch.cat([case.k_buf[slots], case.k[rows]]), torch.cat([case.v_buf[slots], case.v[rows]])
        prefix = torch.ones(n, p, dtype=torch.bool, device=o.device)
        tree = torch.cat([prefix, case.qlen.view(bs, n, n)[b]], 1)
        causal = torch.cat([prefix, torch.ones(n, n, dtype=torch.bool, device=o.device).tril()], 1)
        ref = _reference_attention(case.q[rows], k, v, tree, scale)
        worst = max(worst, (o[rows].double() - ref).abs().max().item())
        teeth = max(teeth, (_reference_attention(case.q[rows], k, v, causal, scale) - ref).abs().max().item())
    return worst, teeth


def stage_masks(rec: Recorder, plan: MaskPlan) -> None:
    device = stage_device()
    case = mask_case(plan, device)
    worst, teeth = reference_errors(case, plan, kernel_output(case, plan))
    # The causal reference differs from the tree one by `teeth`: the kernel must be far closer
    # to the tree's, or the check could not tell a tree mask from a causal one.
    ok = worst <= plan.tol and teeth > 4 * worst
    said = f"max |kernel - reference| {worst:.3g} (tol {plan.tol}), tree vs causal reference {teeth:.3g}"
    rec.finish("ok" if ok else "failed", None if ok else said, said, max_abs_err=worst, tol=plan.tol,
               tree_vs_causal=teeth, prefix_lens=list(plan.prefix_lens), n=plan.n, dtype=plan.dtype,
               device=str(device))  # fmt: skip
