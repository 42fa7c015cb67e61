"""SGLang's verify input for one step's trees: tokens, positions, the tree mask in the layout
the target's attention backend reads, and the links SGLang's tree sampling walks.
"""

from __future__ import annotations

import torch

from sglang_specsot.host import adapter as sgl
from sglang_specsot.speculative.algorithm import NAME
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.host_sync import to_device
from sglang_specsot.speculative.inputs import SoTVerifyInput
from sglang_specsot.speculative.tree_masks import TreeMaskLayout, ancestor_mask, verify_custom_mask


def build_verify_input(
    batch, trees: list[DraftTree], tags: tuple, device, layout: TreeMaskLayout, max_context_len: int,
    capture_hidden_mode=None, mask_buffer: torch.Tensor | None = None,
) -> SoTVerifyInput:  # fmt: skip
    """The verify input of equal-size host trees (padded to the step's width); the links are
    rebuilt from the QLEN mask, which SGLang's reconstruction reads whatever the backend's
    layout, and the mask handed to attention is expanded to `layout`. `capture_hidden_mode`:
    FULL where an EAGLE head's extend reads the target's hidden states of every node.
    `mask_buffer`: the buffer the step's attention backend reads the FULL mask from (its
    graphs by address), written in place instead of a new mask copied there at replay."""
    n, bs = trees[0].size, len(trees)
    assert all(t.size == n for t in trees), "a step's trees are padded to one width"
    # Tokens and parents in one host tensor, one copy that does not block; the mask is then
    # built on the device from the parents (O(bs * n) on the host, not O(bs * n^2)).
    host = torch.tensor([[t.tokens, t.parents] for t in trees], dtype=torch.int64)  # shape: (bs, 2, n)
    on_device = to_device(host, device)
    tokens = on_device[:, 0].reshape(-1)  # shape: (bs * n,)
    mask = ancestor_mask(on_device[:, 1], max(t.height for t in trees))  # shape: (bs * n * n,)
    positions, links = _roots_alone(batch.seq_lens, bs) if n == 1 else _reconstructed(mask, batch.seq_lens, bs, n)
    custom_mask = mask
    if layout != TreeMaskLayout.QLEN_ONLY:
        prefix_sum = _prefix_lens_sum(batch, max_context_len)
        custom_mask = verify_custom_mask(mask, batch.seq_lens, n, prefix_sum, layout, mask_buffer)
    return SoTVerifyInput(
        draft_token=tokens, custom_mask=custom_mask, positions=positions,
        retrieve_index=links[0], retrieve_next_token=links[1], retrieve_next_sibling=links[2],
        retrieve_cum_len=None, spec_steps=n - 1, topk=1, draft_token_num=n,
        capture_hidden_mode=capture_hidden_mode or sgl.CaptureHiddenMode.NULL, seq_lens_sum=None, seq_lens_cpu=None,
        sot_tags=tags, tree_depth=n, host_trees=tuple(trees),
    )  # fmt: skip


def _reconstructed(mask: torch.Tensor, seq_lens: torch.Tensor, bs: int, n: int):
    """Positions and links (index, next token, next sibling) by SGLang's kernel from the QLEN mask."""
    positions = torch.empty(bs * n, dtype=torch.int64, device=mask.device)
    links = [torch.full((bs, n), -1, dtype=torch.int64, device=mask.device) for _ in range(3)]
    sgl.reconstruct_indices_from_tree_mask_func(mask, seq_lens, positions, *links, bs, n)
    return positions, links


def _roots_alone(seq_lens: torch.Tensor, bs: int):
    """What the kernel computes where every tree is its root (a step that drafted nothing):
    each root at its request's length, row b of the window its own, no children or
    siblings. Known, so the step does not launch it (test_worker_trees checks they agree)."""
    device = seq_lens.device
    positions = seq_lens.to(torch.int64, copy=True)  # the forward reads it; seq_lens moves on
    index = torch.arange(bs, dtype=torch.int64, device=device).view(bs, 1)
    no_link = torch.full((bs, 1), -1, dtype=torch.int64, device=device)
    return positions, [index, no_link, no_link.clone()]


def along_accepted_paths(rows: torch.Tensor, accept_index: torch.Tensor) -> torch.Tensor:
    """Per request, the verify window's rows along its accepted path, then filler: row j of a
    request is its tree node `accept_index[b, j]` (node 0, the root, past the accepted length).

    shapes: rows (bs * n, ...) by tree node; accept_index (bs, n) int, -1 past the path.
    Returns (bs * n, ...) in the order of the committed tokens (`predict[accept_index]`)."""
    return rows[accept_index.clamp(min=0).flatten().to(rows.device)]


def _prefix_lens_sum(batch, max_context_len: int) -> int:
    """The batch's committed tokens, from the host where SGLang keeps them (no device read);
    else SGLang's own bound, every request at the model's context length (the FULL mask's
    tail past the real sum is never read)."""
    if getattr(batch, "seq_lens_sum", None) is not None:
        return int(batch.seq_lens_sum)
    seq_lens_cpu = getattr(batch, "seq_lens_cpu", None)
    if seq_lens_cpu is not None:
        return int(seq_lens_cpu.sum())
    return len(batch.reqs) * max_context_len


def host_links(trees: tuple[DraftTree, ...], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(first child, next sibling) per node, as SGLang's tree kernels lay them out."""
    next_token = torch.full((len(trees), n), -1, dtype=torch.int64)  # shape: (bs, n)
    next_sibling = torch.full((len(trees), n), -1, dtype=torch.int64)  # shape: (bs, n)
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


def dummy_verify_input(custom_mask: torch.Tensor, num_tokens_per_req: int, capture_hidden: bool = False) -> SoTVerifyInput:
    """The verify input a TARGET_VERIFY graph is captured with: `num_tokens_per_req` rows per
    request and the runner's static mask buffer, which the attention backend then reads at
    every replay (triton_backend.py:1321-1330 bakes the mask in only where the capture-time
    input has one). Shapes only: the graph's inputs come from the runner's buffers. With
    `capture_hidden` (an EAGLE head drafts) the graph outputs the hidden states of every row,
    which a replay asked for FULL then returns (get_required_capture_hidden_mode)."""
    return SoTVerifyInput(
        draft_token=None, custom_mask=custom_mask, positions=None, retrieve_index=None,
        retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None,
        spec_steps=max(num_tokens_per_req - 1, 1), topk=1, draft_token_num=num_tokens_per_req,
        capture_hidden_mode=sgl.CaptureHiddenMode.FULL if capture_hidden else sgl.CaptureHiddenMode.NULL,
        seq_lens_sum=None, seq_lens_cpu=None, tree_depth=num_tokens_per_req,
    )  # fmt: skip


def dummy_verify_input_around(original, spec_algorithm, custom_mask, num_tokens_per_req, is_draft_worker):
    """AROUND hook on `create_dummy_verify_input` (spec_info.py:476-548, host change
    specsot-dummy-verify-input): SPECSOT's target graphs are captured with its own input,
    every other algorithm's (and any draft worker's) as SGLang builds them."""
    if is_draft_worker or getattr(spec_algorithm, "name", None) != NAME:
        return original(spec_algorithm, custom_mask, num_tokens_per_req, is_draft_worker)
    return dummy_verify_input(custom_mask, num_tokens_per_req, capture_hidden=spec_algorithm.is_eagle())
