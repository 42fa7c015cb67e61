"""Pure-torch versions of the `sgl_kernel` CPU ops SGLang 0.5.23 calls on a CPU without AMX.

Each op keeps the name, argument order and keyword names of its SGLang call site and mutates
its output tensors in place, writing exactly the elements SGLang's own kernels write: the
Triton kernels beside each call site (kernels/ops/speculative/*.py, kernels/ops/kvcache/
cache_move.py, srt/mem_cache/allocation.py) and the JIT-CUDA tree kernels
(kernels/jit/include/sgl_kernel/speculative/{eagle,ngram}.cuh). Paths are relative to the
installed `sglang` package. Addressing goes through flat views with the op's `pool_len` or row
stride, as those kernels' pointer arithmetic does.
"""

from __future__ import annotations

import ctypes

import torch

# TreeMaskMode values (kernels/ops/speculative/spec_tree.py:46-49).
FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


def _flat(t: torch.Tensor, name: str) -> torch.Tensor:
    # The reference kernels address raw memory, so an output must be dense to be written
    # through a view; a silent copy would drop the write.
    assert t.is_contiguous(), (
        f"{name} must be contiguous, got shape {tuple(t.shape)} strides {t.stride()}"
    )
    return t.view(-1)


def _ragged(start: torch.Tensor, end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(segment id, offset inside the segment, total) for every index of the ranges [start, end)."""
    start, end = start.reshape(-1).long(), end.reshape(-1).long()
    lengths = end - start
    assert bool((lengths >= 0).all()), f"ranges need end >= start, got lengths {lengths.tolist()}"
    total = int(lengths.sum())
    segments = torch.arange(lengths.numel(), device=start.device)
    seg = torch.repeat_interleave(segments, lengths, output_size=total)
    # Segments are packed back to back in the output, so output index - segment base = offset.
    seg_base = torch.cumsum(lengths, 0) - lengths
    within = torch.arange(total, device=start.device) - seg_base[seg]
    return seg, within, total


def _pool_slots(req_pool_indices, start_offset, end_offset, pool_len: int):
    """(flat req_to_token indices of row rpi[i], columns [start[i], end[i]), packed; count)."""
    seg, within, total = _ragged(start_offset, end_offset)
    rows = req_pool_indices.reshape(-1).long()[seg]
    return rows * pool_len + start_offset.reshape(-1).long()[seg] + within, total


# --- KV cache and req_to_token bookkeeping -------------------------------------------------


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """In every KV buffer, row tgt_loc[i] = row src_loc[i] (kvcache/cache_move.py:146)."""
    num_locs = tgt_loc.numel()
    assert src_loc.numel() == num_locs, f"tgt_loc has {num_locs} slots, src_loc {src_loc.numel()}"
    if num_locs == 0 or data_ptrs.numel() == 0:
        return
    tgt, src = tgt_loc.reshape(-1).long(), src_loc.reshape(-1).long()
    assert int(torch.minimum(tgt.min(), src.min())) >= 0, "KV slot indices must be non-negative"
    num_rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for ptr, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        rows = _raw_rows(ptr, row_bytes, num_rows)
        # `rows[src]` is a gathered copy, so all sources are read before any target is written:
        # the same overlap-safe staging as the Triton tile and the C++ op.
        rows[tgt] = rows[src]


def _raw_rows(ptr: int, row_bytes: int, num_rows: int) -> torch.Tensor:
    # SGLang hands over only base addresses (memory_pool.py:2545-2565); a ctypes array at that
    # address gives torch a zero-copy, writable byte view of the pool's own buffer.
    buf = (ctypes.c_uint8 * (row_bytes * num_rows)).from_address(ptr)
    return torch.frombuffer(buf, dtype=torch.uint8).view(num_rows, row_bytes)


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """req_to_token[rpi[i], start[i]:end[i]] = the i-th packed run of out_cache_loc
    (srt/mem_cache/allocation.py:692)."""
    slots, total = _pool_slots(req_pool_indices, start_offset, end_offset, pool_len)
    if total:
        values = out_cache_loc.reshape(-1)[:total]
        _flat(req_to_token, "req_to_token")[slots] = values.to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Packed out_cache_loc = req_to_token[rpi[i], start[i]:end[i]] for each i (cache_locs.py:500).

    Only the first sum(end - start) entries are written; SGLang allocates bs * draft_token_num.
    """
    slots, total = _pool_slots(req_pool_indices, start_offset, end_offset, pool_len)
    if total:
        _flat(out_cache_loc, "out_cache_loc")[:total] = req_to_token.reshape(-1)[slots]


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """out_cache_loc[i] = req_to_token[rpi[i], seq_lens[i] : seq_lens[i] + topk * num_steps].

    The Triton kernel (cache_locs.py:43) also writes draft positions when asked; on CPU SGLang
    asserts it never asks (cache_locs.py:98) and only passes positions when seq_lens is CUDA
    (eagle_worker_common.py:280), so this op has no positions argument, like the C++ one.
    """
    width = topk * num_steps
    bs = req_pool_indices.numel()
    base = req_pool_indices.reshape(-1).long() * pool_len + seq_lens.reshape(-1).long()
    slots = base[:, None] + torch.arange(width, device=base.device)
    locs = req_to_token.reshape(-1)[slots.reshape(-1)]
    _flat(out_cache_loc, "out_cache_loc")[: bs * width] = locs


# --- EAGLE draft tree ----------------------------------------------------------------------


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Tree mask, positions and retrieve links of the EAGLE draft tree (eagle.cuh:35-213).

    Node 0 is the verified root; node t >= 1 is draft score index selected_index[b, t - 1].
    retrive_next_token/sibling must come pre-filled with -1, as SGLang does
    (eagle_utils.py:201): like the kernels, this writes only the links that exist.
    """
    bs, n = verified_seq_len.numel(), draft_token_num
    assert topk > 0 and depth > 0 and n > 0, (
        f"need topk, depth, draft_token_num > 0; got {topk}, {depth}, {n}"
    )
    if tree_mask_mode not in (FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING):
        raise ValueError(
            "tree_mask_mode must be 0 (FULL_MASK), 1 (QLEN_ONLY) or 2 (QLEN_ONLY_BITPACKING), "
            f"got {tree_mask_mode}"
        )
    if bs == 0:
        return
    parent = _draft_tree_parents(parent_list, selected_index, topk, depth, bs, n)
    _write_retrieve_links(parent, retrive_index, retrive_next_token, retrive_next_sibling)
    on_path, levels = _draft_tree_paths(parent, depth)
    seq_lens = verified_seq_len.reshape(-1).long()
    _flat(positions, "positions")[: bs * n] = (seq_lens[:, None] + levels).reshape(-1)
    on_path[:, :, 0] = True  # every draft token attends to the root
    _write_tree_mask(tree_mask, on_path, seq_lens, tree_mask_mode)


def _draft_tree_parents(parent_list, selected_index, topk: int, depth: int, bs: int, n: int):
    """(bs, n) parent node of each node; -1 for the root and for a node whose parent was not
    selected (the kernels skip such a node: "invalid eagle tree", eagle.cuh:89-94)."""
    parent = torch.full((bs, n), -1, dtype=torch.long, device=selected_index.device)
    if n == 1:
        return parent
    width = topk * (depth - 1) + 1
    assert depth == 1 or parent_list.shape[-1] == width, (
        f"parent_list must have topk * (depth - 1) + 1 = {width} columns, "
        f"got shape {tuple(parent_list.shape)}"
    )
    selected = selected_index.reshape(bs, n - 1).long()
    parent_slot = selected // topk  # 0: the root; else a column of parent_list
    plist = parent_list.reshape(bs, -1).long()
    assert bool((parent_slot < max(plist.shape[1], 1)).all()), (
        f"selected_index out of range for topk={topk}, depth={depth}: {selected.tolist()}"
    )
    if plist.shape[1] == 0:
        parent[:, 1:] = 0  # depth 1: every selected token hangs off the root
        return parent
    parent_score = plist.gather(1, parent_slot)
    # The parent node is the first selected entry holding the parent's score index.
    match = selected[:, None, :] == parent_score[:, :, None]  # (bs, child, candidate)
    found_at = match.int().argmax(-1) + 1
    parent[:, 1:] = torch.where(parent_slot == 0, 0, torch.where(match.any(-1), found_at, -1))
    return parent


def _write_retrieve_links(parent, retrive_index, retrive_next_token, retrive_next_sibling) -> None:
    # The kernels push children onto their parent's list from the last node down
    # (eagle.cuh:75-103), so the list ends up in ascending node order: first child = the
    # smallest child, next sibling = the next larger child of the same parent.
    bs, n = parent.shape
    node = torch.arange(n, device=parent.device)
    flat_node = torch.arange(bs * n, device=parent.device)
    _flat(retrive_index, "retrive_index")[: bs * n] = flat_node
    is_child = parent[:, None, :] == node[:, None]  # (bs, p, k): k is a child of p
    first_child = torch.where(is_child, node, n).min(-1).values
    _write_where(retrive_next_token, "retrive_next_token", first_child, first_child < n)
    same_parent = (parent[:, :, None] == parent[:, None, :]) & (parent[:, :, None] >= 0)
    later_sibling = same_parent & (node[:, None] < node)  # (bs, k, j): j > k shares k's parent
    next_sibling = torch.where(later_sibling, node, n).min(-1).values
    _write_where(retrive_next_sibling, "retrive_next_sibling", next_sibling, next_sibling < n)


def _write_where(out: torch.Tensor, name: str, values: torch.Tensor, written: torch.Tensor) -> None:
    view = _flat(out, name)[: values.numel()].view(values.shape)
    view.copy_(torch.where(written, values, view.long()))


def _draft_tree_paths(parent: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(bs, n, n) marks of each node and its non-root ancestors, and (bs, n) path lengths.

    The walk stops at the root, at a missing parent, or after `depth` steps: the bounds of the
    Triton version (spec_tree.py:165-202). The CUDA loop is unbounded but agrees on every tree
    SGLang's drafter can build, whose paths are at most `depth` long.
    """
    bs, n = parent.shape
    batch = torch.arange(bs, device=parent.device)[:, None]
    node = torch.arange(n, device=parent.device).expand(bs, n)
    on_path = torch.zeros(bs, n, n, dtype=torch.bool, device=parent.device)
    levels = torch.zeros(bs, n, dtype=torch.long, device=parent.device)
    cur, active = node.clone(), node > 0
    for _ in range(depth):
        if not bool(active.any()):
            break
        on_path[batch, node, cur] |= active
        levels += active
        up = parent.gather(1, cur)
        active = active & (up > 0)
        cur = torch.where(active, up, cur)
    return on_path, levels


def _write_tree_mask(tree_mask, rows: torch.Tensor, seq_lens: torch.Tensor, mode: int) -> None:
    bs, n, _ = rows.shape
    flat = _flat(tree_mask, "tree_mask")
    if mode == QLEN_ONLY:
        flat[: bs * n * n] = rows.reshape(-1).to(flat.dtype)
    elif mode == FULL_MASK:
        # Request b's rows are (seq_len_b + n) wide; the [0, seq_len_b) prefix columns are left
        # as the caller filled them (eagle_utils.py:167-173).
        node = torch.arange(n, device=rows.device)
        prefix = torch.cumsum(seq_lens, 0) - seq_lens
        req_base = n * n * torch.arange(bs, device=rows.device) + n * prefix
        sl = seq_lens[:, None, None]
        cols = req_base[:, None, None] + (sl + n) * node[:, None] + sl + node
        flat[cols.reshape(-1)] = rows.reshape(-1).to(flat.dtype)
    else:
        _write_packed_tree_mask(flat, rows)


def _write_packed_tree_mask(flat: torch.Tensor, rows: torch.Tensor) -> None:
    # One little-endian bit per column in 1, 2 or 4 bytes per row (tree.cuh:77-81). The kernel
    # assigns the row's first byte before OR-ing the path bits, and only ORs the others
    # (eagle.cuh:155, :198).
    bs, n, _ = rows.shape
    assert n <= 32, f"QLEN_ONLY_BITPACKING needs draft_token_num <= 32, got {n}"
    row_bytes = 4 if n > 16 else (2 if n > 8 else 1)
    bits = torch.nn.functional.pad(rows, (0, 8 * row_bytes - n)).view(bs, n, row_bytes, 8)
    weights = torch.tensor([1 << k for k in range(8)], device=rows.device)
    packed = (bits.long() * weights).sum(-1).to(torch.uint8)
    raw = flat.view(torch.uint8)[: bs * n * row_bytes].view(bs, n, row_bytes)
    raw[..., 1:] |= packed[..., 1:]
    raw[..., 0] = packed[..., 0]


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verify (eagle.cuh:214-256): follow, level by level, the first child whose draft
    token equals the target's argmax at the last accepted node.

    Writes predicts at the accepted nodes, accept_index[b, :accepted + 1] (the rest keeps
    SGLang's -1 fill) and accept_token_num (accepted drafts, bonus excluded).
    """
    bs, n = candidates.shape
    num_steps = accept_index.shape[1]
    if bs == 0:
        return
    # A tree walk is sequential per request; a few hundred list lookups beat per-level tensor ops.
    target = target_predict.reshape(-1).tolist()
    links = (candidates, retrive_index, retrive_next_token, retrive_next_sibling)
    tables = [t.reshape(bs, n).tolist() for t in links]
    paths = [_greedy_path(*(tab[b] for tab in tables), target, num_steps) for b in range(bs)]
    accepted = [node for path in paths for node in path]
    predicted = torch.tensor([target[i] for i in accepted], dtype=predicts.dtype)
    _flat(predicts, "predicts")[torch.tensor(accepted)] = predicted
    path_rows = torch.tensor([b for b, path in enumerate(paths) for _ in path])
    path_cols = torch.tensor([k for path in paths for k in range(len(path))])
    accept_index[path_rows, path_cols] = torch.tensor(accepted, dtype=accept_index.dtype)
    counts = [len(path) - 1 for path in paths]
    accept_token_num[:bs] = torch.tensor(counts, dtype=accept_token_num.dtype)


def _greedy_path(cand, ridx, next_token, next_sibling, target, num_steps: int) -> list[int]:
    """Flat indices of the accepted nodes, root first (lists of one request's row)."""
    path = [ridx[0]]
    cur = 0
    for _ in range(1, num_steps):
        cur = _first_match(next_token[cur], cand, next_sibling, target[path[-1]], len(cand))
        if cur == -1:
            break
        path.append(ridx[cur])
    return path


def _first_match(first: int, cand: list, next_sibling: list, want: int, limit: int) -> int:
    # `limit` bounds the sibling walk as the Triton kernel does (spec_tree.py:255), so a
    # malformed sibling cycle ends the walk instead of hanging it.
    cur = first
    for _ in range(limit):
        if cur == -1 or cand[cur] == want:
            return cur
        cur = next_sibling[cur]
    return -1


# --- NGRAM tree ----------------------------------------------------------------------------


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Positions and retrieve links from an (n x n per request) ancestor mask; the contract is
    spelled out in kernels/ops/speculative/reconstruct_tree.py:21-29 (ngram.cuh:26-91)."""
    bs, n = batch_size, draft_token_num
    if bs == 0:
        return
    node = torch.arange(n, device=tree_mask.device)
    mask = tree_mask.reshape(-1)[: bs * n * n].view(bs, n, n).bool()
    ancestors = mask & (node[None, :, None] > node[None, None, :])  # [b, i, j]: j < i only
    parent = torch.where(ancestors, node, -1).max(-1).values
    first_child = torch.where(ancestors, node[:, None], n).min(1).values
    later_sibling = (parent[:, :, None] == parent[:, None, :]) & (node[:, None] > node)  # [b, k, t]
    next_sibling = torch.where(later_sibling, node[:, None], n).min(1).values
    has_sibling = (parent >= 0) & (next_sibling < n)
    seq_lens = verified_seq_len.reshape(-1)[:bs, None].long()
    outputs = {
        "positions": (positions, ancestors.sum(-1) + seq_lens),
        "retrive_index": (retrive_index, torch.arange(bs * n, device=tree_mask.device)),
        "retrive_next_token": (retrive_next_token, torch.where(first_child < n, first_child, -1)),
        "retrive_next_sibling": (retrive_next_sibling, torch.where(has_sibling, next_sibling, -1)),
    }
    for name, (out, values) in outputs.items():
        _flat(out, name)[: bs * n] = values.reshape(-1)


# --- Verify bookkeeping --------------------------------------------------------------------


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """bonus_tokens[i] = accept_tokens[i, accept_lens[i] - 1] on a row width of accept_stride
    (kernels/ops/speculative/eagle.py:13); accept_lens counts the bonus, so it is >= 1."""
    bs = accept_lens.numel()
    row_start = accept_stride * torch.arange(bs, device=accept_lens.device)
    last = row_start + accept_lens.reshape(-1).long() - 1
    _flat(bonus_tokens, "bonus_tokens")[:bs] = accept_tokens.reshape(-1)[last]


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
    size: int | None = None,
) -> None:
    """Compact out_cache_loc[accept_index[i]] over the accepted (not -1) entries, in order
    (kernels/ops/speculative/eagle.py:55). SGLang's CPU call passes no size (eagle.py:81)."""
    flat_index = accept_index.reshape(-1).long()
    if size is not None:
        flat_index = flat_index[:size]
    # As in the Triton kernel, an entry's slot counts the earlier entries != -1 and only
    # entries > -1 are written; the two agree for SGLang's -1-padded accept_index.
    counted = (flat_index != -1).long()
    slot = torch.cumsum(counted, 0) - counted
    written = flat_index > -1
    _flat(accept_out_cache_loc, "accept_out_cache_loc")[slot[written]] = (
        out_cache_loc.reshape(-1)[flat_index[written]].to(accept_out_cache_loc.dtype)
    )


def rotate_input_ids_cpu(
    input_ids: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: torch.Tensor | None = None,
) -> None:
    """Shift each extend segment left by one and put topk_index[i] in the freed last slot, or at
    select_index[i] when given (kernels/ops/speculative/multi_layer_eagle.py:29-63)."""
    ids = _flat(input_ids, "input_ids")
    starts = extend_start_loc.reshape(-1).long()
    lens = extend_seq_lens.reshape(-1).long()
    seg, within, total = _ragged(starts, starts + (lens - 1).clamp(min=0))
    if total:
        dst = starts[seg] + within
        ids[dst] = ids[dst + 1]  # gathered before written: a memmove within each segment
    has_tokens = lens > 0
    last = starts + lens - 1 if select_index is None else select_index.reshape(-1).long()
    ids[last[has_tokens]] = topk_index.reshape(-1)[has_tokens].to(ids.dtype)
