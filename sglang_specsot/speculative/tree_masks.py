"""The verify tree mask in the layout the target's attention backend reads.

SGLang has two bool layouts of one verify window's mask (n draft rows per request; paths
below are relative to the installed `sglang` package):

- QLEN_ONLY: per request, the n x n tree block alone; `bs * n * n` cells. SGLang's CPU verify
  kernels read it, and `reconstruct_indices_from_tree_mask` always does (NGRAM hands it this
  layout, srt/speculative/ngram_worker.py:342).
- FULL: per request, n rows of `prefix + n` columns, the prefix columns first; request b
  starts at `sum_{c<b} n * (prefix_c + n)`. The Triton extend kernel walks it with the
  backend's `mask_indptr` (srt/layers/attention/triton_backend.py:1051-1055;
  kernels/ops/attention/extend_attention.py:489, 740-751), FlashInfer from `n * kv_indptr`
  (kernels/ops/speculative/pack_verify_mask.py:19-23) after `generate_attn_arg_prefill` pads
  a shorter mask with True (srt/speculative/eagle_info.py:134-151). Handed QLEN_ONLY, the
  first reads past the tensor and the second attends with a padded, misaligned mask.

`default_tree_mask_mode` (srt/speculative/eagle_utils.py:132-135) picks QLEN_ONLY on CPU and
FULL everywhere else; `tree_mask_layout` is that rule, `full_layout_mask` the expansion
NGRAM does per request (ngram_worker.py:326-360), here in a few batched tensor ops.
"""

from __future__ import annotations

import enum
import os

import torch

# In a SPECSOT server's environment: the verify mask's layout whatever the device ("full" on a
# CPU is the GPU layout's twin: the CPU backend reads it as Triton does and checks its prefix).
LAYOUT_ENV = "SGLANG_SPECSOT_TREE_MASK_LAYOUT"


class TreeMaskLayout(enum.IntEnum):
    """A bool tree-mask layout; the values are SGLang's `TreeMaskMode` ones
    (kernels/ops/speculative/spec_tree.py:46-49), so `TreeMaskMode(layout)` converts."""

    FULL = 0
    QLEN_ONLY = 1


_FORCED = {"full": TreeMaskLayout.FULL, "qlen_only": TreeMaskLayout.QLEN_ONLY}  # LAYOUT_ENV's values


def tree_mask_layout(device: torch.device | str) -> TreeMaskLayout:
    """The layout the verify attention on `device` reads: QLEN_ONLY on CPU, FULL on a GPU.

    SGLang's `default_tree_mask_mode` makes the same choice from the process's CPU-engine
    flag (`is_cpu()`, set where the server runs on `--device cpu`); the device a worker
    verifies on says the same without a global. `SGLANG_SPECSOT_TREE_MASK_LAYOUT` forces one
    (the CPU twin of the GPU layout).
    """
    forced = os.environ.get(LAYOUT_ENV, "")
    if forced:
        if forced not in _FORCED:
            raise ValueError(f"{LAYOUT_ENV}={forced!r}: set it to 'full' or 'qlen_only', or unset it for the device's layout")
        return _FORCED[forced]
    return TreeMaskLayout.QLEN_ONLY if torch.device(device).type == "cpu" else TreeMaskLayout.FULL


def ancestor_mask(parents: torch.Tensor, height: int) -> torch.Tensor:
    """The QLEN_ONLY mask of trees given by their parents: row i marks node i and its
    ancestors (`draft_tree.tree_mask`), built on the parents' device in `height` gathers, so
    the host does O(1) work per tree instead of O(n^2), and nothing is copied.

    parents: (bs, n) int, parents[b, 0] == -1 (the root), parents[b, i] < i.
    height: the longest root-to-leaf path in edges over the batch (climbs needed).
    Returns (bs * n * n,) bool on `parents`'s device, request-major then row-major.
    """
    bs, n = parents.shape
    up = parents.to(torch.int64).clamp(min=0)  # the root climbs to itself: past it nothing changes
    node = torch.arange(n, dtype=torch.int64, device=parents.device).expand(bs, n)
    mask = torch.zeros(bs, n, n, dtype=torch.bool, device=parents.device)
    mask.scatter_(2, node.unsqueeze(2), True)
    for _ in range(height):
        node = up.gather(1, node)
        mask.scatter_(2, node.unsqueeze(2), True)
    return mask.reshape(-1)


def full_layout_indptr(prefix_lens: torch.Tensor, n: int) -> torch.Tensor:
    """Where each request's rows start in the FULL layout, and the end: the `mask_indptr` the
    Triton backend builds for TARGET_VERIFY (triton_backend.py:1051-1055).

    prefix_lens: (bs,) int, each request's committed length before this step (`seq_lens`).
    Returns (bs + 1,) int64 on `prefix_lens`'s device.
    """
    indptr = torch.zeros(prefix_lens.shape[0] + 1, dtype=torch.int64, device=prefix_lens.device)
    torch.cumsum(n * (prefix_lens.to(torch.int64) + n), dim=0, out=indptr[1:])
    return indptr


def full_layout_mask(
    qlen_mask: torch.Tensor, prefix_lens: torch.Tensor, n: int, prefix_lens_sum: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The FULL-layout mask of a QLEN_ONLY one: each draft row sees its request's whole prefix
    and, inside the window, the nodes its QLEN_ONLY row marks.

    qlen_mask: (bs * n * n,) bool, request-major then row-major (`tree_mask` rows, flattened).
    prefix_lens: (bs,) int on the same device, the committed length before this step.
    prefix_lens_sum: a host int >= sum(prefix_lens): the exact sum where the caller has it
        (`batch.seq_lens_sum`), else an upper bound such as `bs * max_context_len`, the bound
        SGLang sizes its own FULL mask by when the sum is not on the host
        (srt/speculative/eagle_worker_common.py:417-425). Cells past the layout's end are True
        and no reader reaches them: both index from the per-request offsets.
    out: a flat buffer at least that long to write it into (an attention backend's own, as
        SGLang's EAGLE writes its tree into `verify_mask.buffer`); None: a new tensor.
    Returns (n * prefix_lens_sum + bs * n * n,) bool on `qlen_mask`'s device (`out`'s dtype
    and a view of it where given).

    Built with no host sync, so it can run ahead of the device: the sizes come from the
    arguments, and the window cells are written by one scatter.
    """
    bs = prefix_lens.shape[0]
    assert qlen_mask.dtype == torch.bool and qlen_mask.numel() == bs * n * n, (
        f"a QLEN_ONLY mask of {bs} requests with {n} draft tokens has {bs * n * n} bool cells, "
        f"got {qlen_mask.numel()} of {qlen_mask.dtype}"
    )
    size = n * prefix_lens_sum + bs * n * n
    if out is None:
        full = torch.ones(size, dtype=torch.bool, device=qlen_mask.device)
    else:
        assert out.dim() == 1 and out.numel() >= size, f"a mask buffer of {out.numel()} cells for a mask of {size}"
        full = out[:size]
        full.fill_(True)
    full[_window_cells(prefix_lens, n).reshape(-1)] = qlen_mask.reshape(-1).to(full.dtype)
    return full


def verify_custom_mask(
    qlen_mask: torch.Tensor, prefix_lens: torch.Tensor, n: int, prefix_lens_sum: int, layout: TreeMaskLayout,
    out: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """The verify input's `custom_mask` in `layout`, from a QLEN_ONLY mask (arguments as in
    `full_layout_mask`). The QLEN_ONLY mask itself stays what
    `reconstruct_indices_from_tree_mask` reads, whatever the attention's layout."""
    if layout == TreeMaskLayout.QLEN_ONLY:
        return qlen_mask
    return full_layout_mask(qlen_mask, prefix_lens, n, prefix_lens_sum, out)


def _window_cells(prefix_lens: torch.Tensor, n: int) -> torch.Tensor:
    """(bs, n, n) int64: the FULL-layout index of window cell (row i, column j) of each
    request: its start, i rows of `prefix + n`, then past its prefix columns to column j
    (the address extend_attention.py:740-751 loads, with BLOCK offsets summed out)."""
    prefix = prefix_lens.to(torch.int64)[:, None, None]
    start = full_layout_indptr(prefix_lens, n)[:-1, None, None]
    node = torch.arange(n, dtype=torch.int64, device=prefix_lens.device)
    return start + node[None, :, None] * (prefix + n) + prefix + node[None, None, :]
