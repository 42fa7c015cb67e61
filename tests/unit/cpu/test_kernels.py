"""sglang_specsot.cpu.kernels against plain-Python loop references.

Each reference is written from the semantics of SGLang's own kernel (Triton / JIT-CUDA), in a
different form from the implementation: loops, dicts and lists instead of tensor algebra.
Inputs are random with fixed seeds, plus the edge cases (empty batch, batch of one, chains,
trees, orphan nodes, overlapping KV moves).
"""

from __future__ import annotations

import pytest
import torch

from sglang_specsot.cpu import kernels as K

PAGE_SIZES = [1, 16, 64]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randint(low: int, high: int, shape, gen, dtype=torch.int64) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=gen).to(dtype)


def _paged_req_to_token(num_reqs: int, pool_len: int, page_size: int, gen) -> torch.Tensor:
    """req_to_token as a paged allocator leaves it: each row's slots page by page, shuffled."""
    pages_per_row = -(-pool_len // page_size)
    pages = torch.randperm(num_reqs * pages_per_row, generator=gen) + 1  # page 0 is padding
    offsets = torch.arange(page_size)
    rows = (pages.view(num_reqs, pages_per_row, 1) * page_size + offsets).view(num_reqs, -1)
    return rows[:, :pool_len].to(torch.int32).contiguous()


def _ragged_batch(bs: int, pool_len: int, num_reqs: int, gen, max_len: int = 9):
    rpi = torch.randperm(num_reqs, generator=gen)[:bs]
    start = _randint(0, pool_len - max_len, (bs,), gen)
    length = _randint(0, max_len + 1, (bs,), gen)
    if bs:
        length[0] = 0  # an empty segment is legal and must shift nothing
    return rpi, start, start + length


# --- req_to_token / cache locations --------------------------------------------------------


def ref_assign_req_to_token_pool(rpi, rtt, start, end, out_cache_loc):
    rtt = rtt.clone()
    pos = 0
    for i in range(len(rpi)):
        for col in range(int(start[i]), int(end[i])):
            rtt[int(rpi[i]), col] = int(out_cache_loc[pos])
            pos += 1
    return rtt


@pytest.mark.parametrize("bs", [0, 1, 6])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("offset_dtype", [torch.int64, torch.int32])
def test_assign_req_to_token_pool(bs, page_size, offset_dtype):
    gen = _gen(bs * 1000 + page_size)
    rtt = _paged_req_to_token(8, 128, page_size, gen)
    rpi, start, end = _ragged_batch(bs, 128, 8, gen)
    total = int((end - start).sum())
    out_cache_loc = _randint(1, 10_000, (total,), gen)
    expected = ref_assign_req_to_token_pool(rpi, rtt, start, end, out_cache_loc)
    start, end = start.to(offset_dtype), end.to(offset_dtype)
    K.assign_req_to_token_pool_cpu(rpi, rtt, start, end, out_cache_loc, 128)
    assert torch.equal(rtt, expected)


def ref_gather_ranges(rpi, rtt, start, end):
    out = []
    for i in range(len(rpi)):
        out += [int(rtt[int(rpi[i]), c]) for c in range(int(start[i]), int(end[i]))]
    return out


@pytest.mark.parametrize("bs", [0, 1, 6])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_assign_extend_cache_locs(bs, page_size):
    gen = _gen(bs * 77 + page_size)
    rtt = _paged_req_to_token(8, 128, page_size, gen)
    rpi, start, end = _ragged_batch(bs, 128, 8, gen)
    expected = ref_gather_ranges(rpi, rtt, start, end)
    out = torch.full((bs * 9 + 3,), -7, dtype=torch.int64)  # SGLang over-allocates
    K.assign_extend_cache_locs_cpu(rpi.int(), rtt, start, end, out, 128)
    assert out[: len(expected)].tolist() == expected
    assert (out[len(expected) :] == -7).all(), "entries past the packed ranges must stay untouched"


def test_assign_extend_cache_locs_as_fill_front():
    # fill_front_out_cache_loc_func (cache_locs.py:752) reuses the op on an int32 window view.
    window = torch.tensor([[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]])
    num_front = torch.tensor([1, 4, 2])
    out = torch.zeros(12, dtype=torch.int64)
    starts = torch.zeros_like(num_front)
    K.assign_extend_cache_locs_cpu(torch.arange(3), window.int(), starts, num_front, out, 4)
    assert out.tolist() == [11, 21, 22, 23, 24, 31, 32] + [0] * 5


@pytest.mark.parametrize("bs", [0, 1, 5])
@pytest.mark.parametrize("topk,num_steps", [(1, 1), (1, 4), (4, 3)])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_assign_draft_cache_locs_contiguous(bs, topk, num_steps, page_size):
    gen = _gen(bs + 10 * topk + 100 * num_steps + page_size)
    rtt = _paged_req_to_token(8, 96, page_size, gen)
    rpi = torch.randperm(8, generator=gen)[:bs]
    seq_lens = _randint(1, 96 - topk * num_steps, (bs,), gen, torch.int32)
    expected = ref_gather_ranges(rpi, rtt, seq_lens, seq_lens + topk * num_steps)
    out = torch.full((bs * topk * num_steps,), -1, dtype=torch.int64)
    K.assign_draft_cache_locs_contiguous_cpu(rpi, rtt, seq_lens, out, 96, topk, num_steps)
    assert out.tolist() == expected


def test_outputs_must_be_contiguous():
    rtt = torch.zeros(4, 8, dtype=torch.int32).t()  # a transposed view would swallow the writes
    with pytest.raises(AssertionError, match="contiguous"):
        K.assign_req_to_token_pool_cpu(
            torch.tensor([0]), rtt, torch.tensor([0]), torch.tensor([2]), torch.tensor([5, 6]), 4
        )


# --- KV cache moves ------------------------------------------------------------------------


def _kv_buffers(gen, rows: int = 40, layers: int = 3):
    # K and V rows of different widths and dtypes, as with MLA-style v_head_dim or quantised pools.
    bufs = []
    for _ in range(layers):
        bufs.append(torch.randn(rows, 2, 8, generator=gen).to(torch.float16))
        bufs.append(torch.randn(rows, 1, 12, generator=gen).to(torch.bfloat16))
    return bufs


def ref_copy_rows(bufs, tgt, src):
    out = [b.clone() for b in bufs]
    for b in out:
        staged = [b[s].clone() for s in src]  # all sources read before any target is written
        for t, row in zip(tgt, staged):
            b[t] = row
    return out


@pytest.mark.parametrize(
    "tgt,src",
    [
        ([], []),
        ([0], [0]),  # the pool's warm-up call (memory_pool.py:2419-2427)
        ([3, 4, 5], [10, 3, 20]),  # a target that is also a later source
        ([1, 2, 3, 4], [2, 3, 4, 1]),  # a rotation: every row is both read and written
        ([39], [0]),
    ],
)
@pytest.mark.parametrize("loc_dtype", [torch.int64, torch.int32])
def test_copy_all_layer_kv_cache(tgt, src, loc_dtype):
    bufs = _kv_buffers(_gen(len(tgt)))
    expected = ref_copy_rows(bufs, tgt, src)
    ptrs_before = [b.data_ptr() for b in bufs]
    data_ptrs = torch.tensor(ptrs_before, dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
    tgt_loc, src_loc = torch.tensor(tgt, dtype=loc_dtype), torch.tensor(src, dtype=loc_dtype)
    K.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc)
    assert [b.data_ptr() for b in bufs] == ptrs_before
    for got, want in zip(bufs, expected):
        assert torch.equal(got, want)


def test_copy_all_layer_kv_cache_random():
    gen = _gen(5)
    bufs = _kv_buffers(gen, rows=200, layers=4)
    tgt = torch.randperm(200, generator=gen)[:50]
    src = torch.randperm(200, generator=gen)[:50]
    expected = ref_copy_rows(bufs, tgt.tolist(), src.tolist())
    data_ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
    K.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)
    for got, want in zip(bufs, expected):
        assert torch.equal(got, want)


# --- EAGLE draft trees ---------------------------------------------------------------------


def eagle_draft_tree(bs: int, topk: int, depth: int, n: int, gen):
    """parent_list and selected_index exactly as SGLang's drafter builds them
    (spec_utils.py:417-471 select_top_k_tokens, eagle_utils.py:100 organize_draft_results)."""
    scores = torch.rand(bs, topk, generator=gen, dtype=torch.float64)
    score_list = [scores[:, None, :]]
    parents_list = [torch.arange(-1, topk).expand(bs, -1)]
    for i in range(1, depth):
        expand = scores[:, :, None] * torch.rand(bs, topk, topk, generator=gen, dtype=torch.float64)
        scores, cs_index = expand.flatten(1).topk(topk, dim=-1)
        score_list.append(expand)
        parents_list.append(cs_index + topk * topk * (i - 1) + topk)
    flat_scores = torch.cat([s.flatten(1) for s in score_list], dim=1)
    selected = flat_scores.topk(n - 1, dim=-1).indices.sort().values
    if depth > 1:
        parent_list = torch.cat(parents_list[:-1], dim=1)
    else:
        parent_list = torch.empty(bs, 0, dtype=torch.long)
    return parent_list.contiguous(), selected.contiguous()


def ref_tree(parent_list_row, selected_row, topk: int, depth: int):
    """(parent of each node, path of each node) with dicts: node 0 is the root, node t >= 1 is
    score index selected_row[t - 1]; a node whose parent score is not selected has parent None."""
    node_of_score = {}
    for t, score in enumerate(selected_row, start=1):
        node_of_score.setdefault(score, t)

    def parent_of(t):
        slot = selected_row[t - 1] // topk
        return 0 if slot == 0 else node_of_score.get(parent_list_row[slot])

    n = len(selected_row) + 1
    parents = [None] + [parent_of(t) for t in range(1, n)]
    paths = [[]]
    for t in range(1, n):
        path, cur = [], t
        while len(path) < depth:
            path.append(cur)
            if parents[cur] in (0, None):
                break
            cur = parents[cur]
        paths.append(path)
    return parents, paths


def ref_build_tree(parent_list, selected, seq_lens, topk, depth, n, mode, tree_mask, rnt, rns):
    """Expected (tree_mask, positions, retrive_index, next_token, next_sibling), from copies of
    the caller's pre-filled tensors."""
    tree_mask, rnt, rns = tree_mask.clone(), rnt.clone(), rns.clone()
    positions, ridx = [], []
    mask_base = 0
    for b in range(len(seq_lens)):
        sl = int(seq_lens[b])
        parents, paths = ref_tree(parent_list[b].tolist(), selected[b].tolist(), topk, depth)
        for p in range(n):
            children = [t for t in range(1, n) if parents[t] == p]
            if children:
                rnt[b, p] = children[0]
            for a, c in zip(children, children[1:]):
                rns[b, a] = c
        for t in range(n):
            ridx.append(b * n + t)
            positions.append(sl + len(paths[t]))
            cols = {0, *paths[t]}
            for c in range(n):
                if mode == K.QLEN_ONLY:
                    tree_mask[(b * n + t) * n + c] = c in cols
                elif mode == K.FULL_MASK:
                    tree_mask[mask_base + t * (sl + n) + sl + c] = c in cols
        if mode == K.QLEN_ONLY_BITPACKING:
            _ref_pack_rows(tree_mask, b, n, [{0, *paths[t]} for t in range(n)])
        mask_base += n * (sl + n)
    return tree_mask, positions, ridx, rnt, rns


def _ref_pack_rows(tree_mask, b, n, row_cols):
    row_bytes = 4 if n > 16 else (2 if n > 8 else 1)
    raw = tree_mask.view(torch.uint8)
    for t, cols in enumerate(row_cols):
        base = (b * n + t) * row_bytes
        raw[base] = 1
        for c in cols:
            raw[base + c // 8] |= 1 << (c % 8)


def _tree_outputs(bs, n, seq_lens, mode, gen, link_fill: int = -1):
    """Output buffers as SGLang allocates them (eagle_utils.py:158-205). With a generator the
    masks start from random bits instead, so a test sees which bits the op leaves alone."""
    if mode == K.FULL_MASK:
        mask = torch.rand(int(seq_lens.sum()) * n + bs * n * n, generator=gen) < 0.5
    elif mode == K.QLEN_ONLY:
        mask = torch.ones(bs * n * n, dtype=torch.bool)
    else:
        row_bytes = 4 if n > 16 else (2 if n > 8 else 1)
        raw = torch.zeros(bs * n * row_bytes, dtype=torch.uint8)
        if gen is not None:
            raw = _randint(0, 256, raw.shape, gen, torch.uint8)
        mask = raw.view({1: torch.uint8, 2: torch.uint16, 4: torch.uint32}[row_bytes])
    links = torch.full((3, bs, n), link_fill, dtype=torch.long)
    positions = torch.full((bs * n,), -5, dtype=torch.long)
    return mask, positions, links[0], links[1], links[2]


TREE_SHAPES = [  # (topk, depth, draft_token_num)
    (1, 1, 1),
    (1, 1, 2),
    (1, 3, 4),
    (1, 5, 6),
    (1, 5, 3),  # fewer draft tokens than steps
    (2, 3, 4),
    (4, 3, 8),
    (4, 5, 16),
    (8, 4, 32),
    (3, 6, 12),
]


@pytest.mark.parametrize("topk,depth,n", TREE_SHAPES)
@pytest.mark.parametrize("mode", [K.FULL_MASK, K.QLEN_ONLY, K.QLEN_ONLY_BITPACKING])
@pytest.mark.parametrize("bs", [0, 1, 3])
def test_build_tree_kernel_efficient(topk, depth, n, mode, bs):
    gen = _gen(topk * 1000 + depth * 100 + n + bs)
    parent_list, selected = eagle_draft_tree(bs, topk, depth, n, gen)
    seq_lens = _randint(1, 12, (bs,), gen)
    # Links pre-filled with -7 rather than SGLang's -1 show that only existing links are written.
    mask, positions, ridx, rnt, rns = _tree_outputs(bs, n, seq_lens, mode, gen, link_fill=-7)
    expected = ref_build_tree(parent_list, selected, seq_lens, topk, depth, n, mode, mask, rnt, rns)
    K.build_tree_kernel_efficient_cpu(
        parent_list, selected, seq_lens, mask, positions, ridx, rnt, rns, topk, depth, n, mode
    )
    exp_mask, exp_positions, exp_ridx, exp_rnt, exp_rns = expected
    assert torch.equal(mask, exp_mask)
    assert positions.tolist() == exp_positions
    assert ridx.reshape(-1).tolist() == exp_ridx
    assert torch.equal(rnt, exp_rnt)
    assert torch.equal(rns, exp_rns)


@pytest.mark.parametrize("n", [2, 4, 6])
def test_build_tree_chain_closed_form(n):
    # topk = 1: a chain: positions seq_len + i, next token i + 1, no
    # siblings, a causal mask over the draft window.
    bs, depth = 2, n - 1
    parent_list, selected = eagle_draft_tree(bs, 1, depth, n, _gen(n))
    seq_lens = torch.tensor([5, 9])
    mask, positions, ridx, rnt, rns = _tree_outputs(bs, n, seq_lens, K.QLEN_ONLY, None)
    K.build_tree_kernel_efficient_cpu(
        parent_list, selected, seq_lens, mask, positions, ridx, rnt, rns, 1, depth, n, K.QLEN_ONLY
    )
    assert torch.equal(positions.view(bs, n), seq_lens[:, None] + torch.arange(n))
    assert rnt.tolist() == [list(range(1, n)) + [-1]] * bs
    assert (rns == -1).all()
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    assert torch.equal(mask.view(bs, n, n), causal.expand(bs, n, n))


def test_build_tree_orphan_node_is_skipped():
    # topk 2, depth 3. Scores 0-1 are level 1, 2-5 level 2 (children of parent_list[1:3]),
    # 6-9 level 3 (children of parent_list[3:5] = level-2 scores 2 and 4). Score 6's parent
    # (score 2) is not selected: the node is skipped from the links and its path stops at itself.
    parent_list = torch.tensor([[-1, 0, 1, 2, 4]])
    selected = torch.tensor([[0, 1, 3, 6]])  # nodes 1..4
    seq_lens = torch.tensor([7])
    mask, positions, ridx, rnt, rns = _tree_outputs(1, 5, seq_lens, K.QLEN_ONLY, None)
    K.build_tree_kernel_efficient_cpu(
        parent_list, selected, seq_lens, mask, positions, ridx, rnt, rns, 2, 3, 5, K.QLEN_ONLY
    )
    assert positions.tolist() == [7, 8, 8, 9, 8]
    assert rnt.tolist() == [[1, 3, -1, -1, -1]]  # node 3 (score 3) hangs off node 1 (score 0)
    assert rns.tolist() == [[-1, 2, -1, -1, -1]]
    rows = mask.view(5, 5).int().tolist()
    assert rows[3] == [1, 1, 0, 1, 0] and rows[4] == [1, 0, 0, 0, 1]


def test_build_tree_walk_is_bounded_by_depth():
    # A malformed parent_list whose parents form a cycle (scores 1 and 2 name each other):
    # the CUDA walk would never end; the Triton walk (spec_tree.py:165) stops after depth steps.
    topk, depth, n = 1, 3, 3
    parent_list, selected = torch.tensor([[-1, 2, 1]]), torch.tensor([[1, 2]])
    seq_lens = torch.tensor([4])
    mask, positions, ridx, rnt, rns = _tree_outputs(1, n, seq_lens, K.QLEN_ONLY, None)
    args = (parent_list, selected, seq_lens, topk, depth, n, K.QLEN_ONLY)
    expected = ref_build_tree(*args, mask, rnt, rns)
    outputs = (mask, positions, ridx, rnt, rns)
    K.build_tree_kernel_efficient_cpu(*args[:3], *outputs, topk, depth, n, K.QLEN_ONLY)
    assert positions.tolist() == expected[1] == [4, 7, 7]
    assert torch.equal(mask, expected[0])
    assert mask.view(n, n).int().tolist() == [[1, 0, 0], [1, 1, 1], [1, 1, 1]]
    assert rnt.tolist() == expected[3].tolist() == [[-1, 2, 1]]


def test_build_tree_rejects_unknown_mask_mode():
    parent_list, selected = eagle_draft_tree(1, 2, 2, 3, _gen(0))
    seq_lens = torch.tensor([4])
    mask, positions, ridx, rnt, rns = _tree_outputs(1, 3, seq_lens, K.QLEN_ONLY, None)
    with pytest.raises(ValueError, match="tree_mask_mode"):
        K.build_tree_kernel_efficient_cpu(
            parent_list, selected, seq_lens, mask, positions, ridx, rnt, rns, 2, 2, 3, 3
        )


# --- Greedy verify -------------------------------------------------------------------------


def ref_verify(candidates, ridx, rnt, rns, target, num_steps):
    """(predicts writes, accept_index rows, accept counts) by explicit child lists."""
    bs, n = candidates.shape
    target = target.reshape(-1).tolist()
    writes, rows, counts = {}, [], []
    for b in range(bs):
        cand, ri, nt, ns = (t[b].tolist() for t in (candidates, ridx, rnt, rns))

        def children(x):
            out, c = [], nt[x]
            while c != -1:
                out.append(c)
                c = ns[c]
            return out

        node, path = 0, [ri[0]]
        while len(path) < num_steps:
            match = [c for c in children(node) if cand[c] == target[path[-1]]]
            if not match:
                break
            node = match[0]
            path.append(ri[node])
        writes.update({p: target[p] for p in path})
        rows.append(path + [-1] * (num_steps - len(path)))
        counts.append(len(path) - 1)
    return writes, rows, counts


def _run_verify(candidates, ridx, rnt, rns, target, num_steps):
    bs, n = candidates.shape
    predicts = torch.full((bs * n,), -3, dtype=torch.int32)
    accept_index = torch.full((bs, num_steps), -1, dtype=torch.int32)
    accept_num = torch.empty((bs,), dtype=torch.int32)
    K.verify_tree_greedy_cpu(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_num,
        candidates=candidates,
        retrive_index=ridx,
        retrive_next_token=rnt,
        retrive_next_sibling=rns,
        target_predict=target,
    )
    return predicts, accept_index, accept_num


def _reference_links(parent_list, selected, seq_lens, topk, depth, n):
    bs = len(seq_lens)
    mask, _, _, rnt, rns = _tree_outputs(bs, n, seq_lens, K.QLEN_ONLY, None)
    args = (parent_list, selected, seq_lens, topk, depth, n, K.QLEN_ONLY)
    _, _, ridx, rnt, rns = ref_build_tree(*args, mask, rnt, rns)
    return torch.tensor(ridx).view(bs, n), rnt, rns


@pytest.mark.parametrize("topk,depth,n", [s for s in TREE_SHAPES if s[2] > 1])
@pytest.mark.parametrize("bs", [0, 1, 4])
def test_verify_tree_greedy(topk, depth, n, bs):
    gen = _gen(topk * 31 + depth * 7 + n + bs)
    parent_list, selected = eagle_draft_tree(bs, topk, depth, n, gen)
    seq_lens = _randint(1, 9, (bs,), gen)
    ridx, rnt, rns = _reference_links(parent_list, selected, seq_lens, topk, depth, n)
    for trial in range(6):
        vocab = 2 + trial  # a small vocabulary makes matches, and so deep accepts, likely
        candidates = _randint(0, vocab, (bs, n), gen)
        target = _randint(0, vocab, (bs, n), gen)
        outputs = _run_verify(candidates, ridx, rnt, rns, target, depth + 1)
        predicts, accept_index, accept_num = outputs
        writes, rows, counts = ref_verify(candidates, ridx, rnt, rns, target, depth + 1)
        expected_predicts = [writes.get(i, -3) for i in range(bs * n)]
        assert predicts.tolist() == expected_predicts
        assert accept_index.tolist() == rows
        assert accept_num.tolist() == counts


@pytest.mark.timeout(60)
def test_verify_sibling_cycle_terminates():
    # Malformed links with a sibling cycle and no match: the Triton kernel bounds the sibling
    # walk by draft_token_num (spec_tree.py:255), so nothing is accepted instead of hanging.
    candidates = torch.tensor([[5, 6, 7]])
    ridx, rnt = torch.tensor([[0, 1, 2]]), torch.tensor([[1, -1, -1]])
    rns = torch.tensor([[-1, 2, 1]])  # node 1 -> 2 -> 1 -> ...
    target = torch.tensor([[9, 9, 9]])
    predicts, accept_index, accept_num = _run_verify(candidates, ridx, rnt, rns, target, 3)
    assert accept_num.tolist() == [0]
    assert accept_index.tolist() == [[0, -1, -1]]
    assert predicts.tolist() == [9, -3, -3]


@pytest.mark.parametrize("n", [2, 5, 8])
def test_verify_chain_matches_cumprod(n):
    # For a chain the accepted drafts are the leading run of candidates[:, 1:] == target[:, :-1].
    bs = 16
    gen = _gen(n)
    parent_list, selected = eagle_draft_tree(bs, 1, n - 1, n, gen)
    seq_lens = torch.ones(bs, dtype=torch.long)
    ridx, rnt, rns = _reference_links(parent_list, selected, seq_lens, 1, n - 1, n)
    candidates = _randint(0, 2, (bs, n), gen)
    target = _randint(0, 2, (bs, n), gen)
    _, accept_index, accept_num = _run_verify(candidates, ridx, rnt, rns, target, n)
    run = torch.cumprod((candidates[:, 1:] == target[:, :-1]).int(), dim=1).sum(1)
    assert accept_num.tolist() == run.tolist()
    for b in range(bs):
        accepted = int(run[b])
        assert accept_index[b].tolist() == [b * n + i for i in range(accepted + 1)] + [-1] * (
            n - 1 - accepted
        )


def test_verify_follows_a_chosen_branch():
    # Targets that spell out one root-to-leaf path of a topk>1 tree must accept exactly it.
    topk, depth, n = 4, 4, 12
    parent_list, selected = eagle_draft_tree(1, topk, depth, n, _gen(9))
    parents, paths = ref_tree(parent_list[0].tolist(), selected[0].tolist(), topk, depth)
    leaf = max(range(n), key=lambda t: len(paths[t]))
    branch = [0] + paths[leaf][::-1]
    candidates = torch.arange(100, 100 + n).view(1, n)
    target = torch.zeros(1, n, dtype=torch.long)
    for a, c in zip(branch, branch[1:]):
        target[0, a] = candidates[0, c]
    ridx, rnt, rns = _reference_links(parent_list, selected, torch.tensor([3]), topk, depth, n)
    _, accept_index, accept_num = _run_verify(candidates, ridx, rnt, rns, target, depth + 1)
    assert accept_num.item() == len(branch) - 1
    assert accept_index[0, : len(branch)].tolist() == branch


# --- NGRAM tree mask -----------------------------------------------------------------------


def ref_reconstruct(mask, seq_lens, bs, n):
    """Loop port of the contract as ngram.cuh:26-91 states it: the nearest earlier marked
    column is the parent; a later row is a sibling when it marks that parent and nothing
    between the parent and its own diagonal."""
    positions, ridx, nxt, sib = [], [], [], []
    for b in range(bs):
        m = mask[b * n * n : (b + 1) * n * n].view(n, n).tolist()
        for t in range(n):
            marked = [j for j in range(t) if m[t][j]]
            parent = marked[-1] if marked else -1
            positions.append(len(marked) + int(seq_lens[b]))
            ridx.append(b * n + t)
            nxt.append(next((i for i in range(t + 1, n) if m[i][t]), -1))
            siblings = [
                i
                for i in range(t + 1, n)
                if parent != -1 and m[i][parent] and not any(m[i][parent + 1 : i])
            ]
            sib.append(siblings[0] if siblings else -1)
    return positions, ridx, nxt, sib


def _ngram_mask(bs, n, gen, garbage: bool):
    if garbage:  # the contract is defined for any mask, not only well-formed trees
        return torch.rand(bs * n * n, generator=gen) < 0.4
    rows = []
    for _ in range(bs):
        parent = [-1] + [int(torch.randint(0, t, (1,), generator=gen)) for t in range(1, n)]
        m = torch.zeros(n, n, dtype=torch.bool)
        for t in range(n):
            cur = t
            while cur != -1:
                m[t, cur] = True
                cur = parent[cur]
        rows.append(m.reshape(-1))
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.bool)


@pytest.mark.parametrize("bs", [0, 1, 4])
@pytest.mark.parametrize("n", [1, 2, 8, 17])
@pytest.mark.parametrize("garbage", [False, True])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.uint8])
def test_reconstruct_indices_from_tree_mask(bs, n, garbage, mask_dtype):
    gen = _gen(bs * 100 + n + int(garbage))
    mask = _ngram_mask(bs, n, gen, garbage)
    seq_lens = _randint(0, 50, (bs,), gen)
    positions = torch.full((bs * n,), -9, dtype=torch.long)
    ridx, nxt, sib = torch.full((3, bs, n), -9, dtype=torch.long)
    mask_in = mask.to(mask_dtype)
    K.reconstruct_indices_from_tree_mask(mask_in, seq_lens, positions, ridx, nxt, sib, bs, n)
    exp_positions, exp_ridx, exp_nxt, exp_sib = ref_reconstruct(mask, seq_lens, bs, n)
    assert positions.tolist() == exp_positions
    assert ridx.reshape(-1).tolist() == exp_ridx
    assert nxt.reshape(-1).tolist() == exp_nxt
    assert sib.reshape(-1).tolist() == exp_sib


# --- Verify bookkeeping --------------------------------------------------------------------


@pytest.mark.parametrize("bs", [0, 1, 7])
def test_fill_bonus_tokens(bs):
    gen = _gen(bs)
    stride = 4
    accept_tokens = _randint(0, 1000, (bs, stride), gen, torch.int32)
    accept_lens = _randint(1, stride + 1, (bs,), gen, torch.int32)
    bonus = torch.full((bs,), -1, dtype=torch.int32)
    K.fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus, stride)
    assert bonus.tolist() == [int(accept_tokens[i, int(accept_lens[i]) - 1]) for i in range(bs)]


def ref_fill_accept_out_cache_loc(accept_index, out_cache_loc, size):
    return [int(out_cache_loc[i]) for i in accept_index.reshape(-1).tolist()[:size] if i != -1]


@pytest.mark.parametrize("bs", [0, 1, 5])
@pytest.mark.parametrize("pass_size", [False, True])
def test_fill_accept_out_cache_loc(bs, pass_size):
    gen = _gen(bs + 50)
    steps, n = 4, 6
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
    for b in range(bs):
        k = int(torch.randint(1, steps + 1, (1,), generator=gen))
        accept_index[b, :k] = torch.randperm(n, generator=gen)[:k].int() + b * n
    out_cache_loc = _randint(1, 500, (bs * n,), gen)
    out = torch.zeros(bs * steps, dtype=torch.int64)
    size = bs * steps
    size_arg = (size,) if pass_size else ()  # SGLang's CPU call site passes none
    K.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, out, *size_arg)
    expected = ref_fill_accept_out_cache_loc(accept_index, out_cache_loc, size)
    assert out.tolist() == expected + [0] * (size - len(expected))


def ref_rotate(ids, starts, lens, topk_index, select_index):
    ids = ids.tolist()
    for i in range(len(starts)):
        s, n = int(starts[i]), int(lens[i])
        ids[s : s + max(n - 1, 0)] = ids[s + 1 : s + n]
        if n > 0:
            slot = s + n - 1 if select_index is None else int(select_index[i])
            ids[slot] = int(topk_index[i])
    return ids


@pytest.mark.parametrize("bs", [0, 1, 5])
@pytest.mark.parametrize("use_select", [False, True])
def test_rotate_input_ids(bs, use_select):
    gen = _gen(bs * 3 + int(use_select))
    lens = _randint(0, 6, (bs,), gen)
    if bs:
        lens[0] = 1
    starts = torch.cumsum(lens, 0) - lens
    ids = _randint(0, 1000, (int(lens.sum()) + 2,), gen)
    topk_index = _randint(1000, 2000, (bs, 1), gen)
    select = starts.clone() if use_select else None  # somewhere other than the default slot
    expected = ref_rotate(ids, starts, lens, topk_index.view(-1), select)
    K.rotate_input_ids_cpu(ids, starts.int(), lens, topk_index, select)
    assert ids.tolist() == expected


# SGLang's Triton port of the CUDA tree kernel (spec_tree.py, its XPU path), interpreted: the
# oracle for what a GPU builds from a draft model's chains and trees. SPECSOT's draft shapes
# (a 4-step chain in a 5-node tree; top-k trees) at batch sizes above one, where a wrong
# stride would read another request's row.
_TRITON_TREE_RUNNER = """
import sys, torch
from sglang.kernels.ops.speculative.spec_tree import sgl_build_tree_kernel_triton
cases = torch.load(sys.argv[1])
for c in cases:
    sgl_build_tree_kernel_triton(*c["args"], *c["outs"], c["topk"], c["depth"], c["n"], c["mode"])
torch.save([c["outs"] for c in cases], sys.argv[2])
"""

TRITON_TREE_SHAPES = [(1, 4, 5, 3), (1, 5, 6, 4), (2, 3, 6, 3), (4, 3, 8, 2)]  # (topk, depth, n, bs)


def test_build_tree_matches_sglangs_triton_kernel(tmp_path):
    import os
    import subprocess
    import sys

    cases, ours = [], []
    for topk, depth, n, bs in TRITON_TREE_SHAPES:
        for mode in (K.FULL_MASK, K.QLEN_ONLY):
            gen = _gen(topk * 100 + depth * 10 + n + bs)
            parent_list, selected = eagle_draft_tree(bs, topk, depth, n, gen)
            seq_lens = _randint(1, 12, (bs,), gen)
            outs = _tree_outputs(bs, n, seq_lens, mode, None)
            mine = [t.clone() for t in outs]
            K.build_tree_kernel_efficient_cpu(parent_list, selected, seq_lens, *mine, topk, depth, n, mode)
            cases.append({"args": (parent_list, selected, seq_lens), "outs": list(outs), "topk": topk,
                          "depth": depth, "n": n, "mode": mode})  # fmt: skip
            ours.append(mine)
    torch.save(cases, tmp_path / "cases.pt")
    proc = subprocess.run(
        [sys.executable, "-c", _TRITON_TREE_RUNNER, str(tmp_path / "cases.pt"), str(tmp_path / "outs.pt")],
        cwd=tmp_path, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, f"SGLang's tree kernel under TRITON_INTERPRET failed:\n{proc.stderr[-4000:]}"
    theirs = torch.load(tmp_path / "outs.pt")
    names = ("tree_mask", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling")
    for case, mine, triton_outs in zip(cases, ours, theirs):
        shape = {k: case[k] for k in ("topk", "depth", "n", "mode")} | {"bs": len(case["args"][2])}
        for name, a, b in zip(names, mine, triton_outs):
            assert torch.equal(a, b), f"{name} differs from SGLang's Triton kernel for {shape}"
