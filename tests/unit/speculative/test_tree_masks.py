"""The FULL-layout verify mask against SGLang's GPU reader and the CPU backend's, on CPU.

SGLang's own Triton extend-attention kernel (the Triton backend's TARGET_VERIFY attention)
runs here under Triton's interpreter on CPU tensors, in a subprocess of its own: the
interpreter is chosen when `triton.jit` decorates the kernel, at import, so it must be set
before anything imports SGLang's kernels. Every case is checked against attention computed
in float64 over each draft row's prefix and tree ancestors, built from the `DraftTree`
itself, so a layout error in the mask cannot hide in the reference.
"""

from __future__ import annotations

import importlib
import os
import random
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from sglang_specsot.cpu.attention import verify_window_masks
from sglang_specsot.speculative.draft_tree import DraftTree, tree_mask
from sglang_specsot.speculative.tree_masks import (
    TreeMaskLayout,
    ancestor_mask,
    full_layout_indptr,
    full_layout_mask,
    tree_mask_layout,
    verify_custom_mask,
)
from tests.unit.speculative.builders import random_tree

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16  # GQA: two query heads per KV head
SCALE = HEAD_DIM**-0.5
KERNEL_TOL = 1e-4  # float32 kernel against the float64 reference
# (batch size, draft tokens, largest prefix) of each kernel case; prefixes past 64 span two of
# the kernel's prefix tiles (BLOCK_N 64 off CUDA, extend_attention.py:137-138).
KERNEL_CASES = [(1, 4, 9), (3, 6, 40), (4, 8, 100), (2, 5, 70), (5, 3, 20)]

# Runs SGLang's kernel on each saved case with the Triton backend's TARGET_VERIFY arguments
# (triton_backend.py:1747, 1888-1912: causal, k/v scale 1, the layer's scaling).
_KERNEL_RUNNER = """
import sys, torch
from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
runs, outs = torch.load(sys.argv[1]), []
for r in runs:
    o = torch.empty_like(r["q"])
    extend_attention_fwd(
        r["q"], r["k"], r["v"], o, r["k_buffer"], r["v_buffer"], r["qo_indptr"], r["kv_indptr"],
        r["kv_indices"], r["custom_mask"], True, r["mask_indptr"], r["n"], 1.0, 1.0,
        sm_scale=r["sm_scale"], skip_prefix_custom_mask=r["skip_prefix_custom_mask"],
    )
    outs.append(o)
torch.save(outs, sys.argv[2])
"""


@dataclass(frozen=True)
class Case:
    """One verify window: trees padded to `n`, each request's prefix K/V and the window's Q/K/V."""

    trees: tuple[DraftTree, ...]
    n: int
    prefix_lens: tuple[int, ...]
    q: torch.Tensor  # (bs * n, HEADS, HEAD_DIM) float32
    k: torch.Tensor  # (bs * n, KV_HEADS, HEAD_DIM) float32, the window's keys
    v: torch.Tensor  # (bs * n, KV_HEADS, HEAD_DIM) float32
    k_prefix: tuple[torch.Tensor, ...]  # per request (prefix, KV_HEADS, HEAD_DIM) float32
    v_prefix: tuple[torch.Tensor, ...]

    @property
    def bs(self) -> int:
        return len(self.trees)

    @property
    def seq_lens(self) -> torch.Tensor:
        return torch.tensor(self.prefix_lens, dtype=torch.int64)

    def qlen_mask(self) -> torch.Tensor:
        """The QLEN_ONLY mask as verify_input.build_verify_input builds it."""
        return torch.tensor([tree_mask(t, self.n) for t in self.trees], dtype=torch.bool).flatten()

    def full_mask(self, bound: int = 0) -> torch.Tensor:
        return full_layout_mask(self.qlen_mask(), self.seq_lens, self.n, sum(self.prefix_lens) + bound)


def _case(seed: int, bs: int, n: int, max_prefix: int) -> Case:
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    prefix_lens = tuple(rng.randrange(max_prefix + 1) for _ in range(bs))

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    return Case(
        trees=tuple(random_tree(rng, n) for _ in range(bs)), n=n, prefix_lens=prefix_lens,
        q=randn(bs * n, HEADS, HEAD_DIM), k=randn(bs * n, KV_HEADS, HEAD_DIM), v=randn(bs * n, KV_HEADS, HEAD_DIM),
        k_prefix=tuple(randn(p, KV_HEADS, HEAD_DIM) for p in prefix_lens),
        v_prefix=tuple(randn(p, KV_HEADS, HEAD_DIM) for p in prefix_lens),
    )  # fmt: skip


def _true_rows(case: Case) -> list[torch.Tensor]:
    """Per request, (n, prefix + n) bool: the prefix, then the row's ancestors and itself."""
    rows = []
    for tree, p in zip(case.trees, case.prefix_lens):
        row = torch.zeros(case.n, p + case.n, dtype=torch.bool)
        row[:, :p] = True
        for i in range(case.n):
            row[i, [p + j for j in tree.ancestors_or_self(i)]] = True
        rows.append(row)
    return rows


def _dense_attention(case: Case, rows: list[torch.Tensor]) -> torch.Tensor:
    """(bs * n, HEADS, HEAD_DIM) float64: softmax over the keys each row's mask lets it see."""
    out = []
    for b, row in enumerate(rows):
        window = slice(b * case.n, (b + 1) * case.n)
        keys = torch.cat((case.k_prefix[b], case.k[window])).double().repeat_interleave(HEADS // KV_HEADS, 1)
        values = torch.cat((case.v_prefix[b], case.v[window])).double().repeat_interleave(HEADS // KV_HEADS, 1)
        scores = torch.einsum("qhd,khd->hqk", case.q[window].double(), keys) * SCALE
        weights = scores.masked_fill(~row, float("-inf")).softmax(-1)
        out.append(torch.einsum("hqk,khd->qhd", weights, values))
    return torch.cat(out)


def _cpu_backend_rows(case: Case, mask: torch.Tensor) -> list[torch.Tensor]:
    """The rows the specsot_cpu backend attends with (cpu/attention.py plan_target_verify)."""
    windows = verify_window_masks(mask, list(case.prefix_lens), case.n)
    return [torch.cat((torch.ones(case.n, p, dtype=torch.bool), w), 1) for p, w in zip(case.prefix_lens, windows)]


# -- the layout itself -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_full_layout_mask_is_ngrams_per_request_expansion(seed):
    # NGRAM's loop (ngram_worker.py:355-371): per request, ones over the prefix beside its
    # QLEN_ONLY block, flattened row-major and concatenated.
    case = _case(seed, bs=seed + 1, n=random.Random(seed).choice([1, 2, 5, 8]), max_prefix=30)
    blocks = case.qlen_mask().view(case.bs, case.n, case.n)
    want = torch.cat([
        torch.cat((torch.ones(case.n, p, dtype=torch.bool), blocks[b]), 1).flatten()
        for b, p in enumerate(case.prefix_lens)
    ])  # fmt: skip
    assert torch.equal(case.full_mask(), want)
    assert torch.equal(torch.cat([row.flatten() for row in _true_rows(case)]), want)


def test_full_layout_indptr_is_the_triton_backends_mask_indptr():
    # triton_backend.py:1052-1055: mask_indptr[1:] = cumsum(n * (seq_lens + n)).
    seq_lens, n = torch.tensor([0, 7, 3, 12], dtype=torch.int32), 4
    assert full_layout_indptr(seq_lens, n).tolist() == [0, 16, 60, 88, 152]
    assert full_layout_indptr(seq_lens, n).dtype == torch.int64


def test_full_layout_mask_sized_by_an_upper_bound_keeps_the_layout():
    case = _case(3, bs=4, n=5, max_prefix=20)
    exact, bounded = case.full_mask(), case.full_mask(bound=37)
    assert bounded.numel() == exact.numel() + 37 * case.n
    assert torch.equal(bounded[: exact.numel()], exact) and bool(bounded[exact.numel() :].all())


def test_full_layout_mask_reads_nothing_back_to_the_host():
    # Meta tensors hold no data: any .item() / .tolist() / data-dependent size would raise.
    case = _case(1, bs=3, n=4, max_prefix=10)
    out = full_layout_mask(case.qlen_mask().to("meta"), case.seq_lens.to("meta"), case.n, sum(case.prefix_lens))
    assert out.device.type == "meta" and out.shape == case.full_mask().shape


def test_full_layout_mask_rejects_a_mask_of_another_shape():
    with pytest.raises(AssertionError, match="has 18 bool cells, got 9"):
        full_layout_mask(torch.ones(9, dtype=torch.bool), torch.tensor([3, 4]), 3, 7)


# -- which layout ------------------------------------------------------------------------------


@pytest.mark.parametrize(("cpu_engine", "device"), [(True, "cpu"), (False, "cuda"), (False, "cuda:1")])
def test_full_layout_off_cpu_is_sglangs_default_tree_mask_mode(monkeypatch, cpu_engine, device):
    eagle_utils = importlib.import_module("sglang.srt.speculative.eagle_utils")
    monkeypatch.setattr(eagle_utils, "_is_cpu", cpu_engine)
    assert tree_mask_layout(device) == TreeMaskLayout(int(eagle_utils.default_tree_mask_mode()))


def test_full_layout_enum_converts_to_sglangs_tree_mask_mode():
    mode = importlib.import_module("sglang.kernels.ops.speculative.spec_tree").TreeMaskMode
    assert mode(TreeMaskLayout.FULL) is mode.FULL_MASK and mode(TreeMaskLayout.QLEN_ONLY) is mode.QLEN_ONLY


def test_full_layout_verify_custom_mask_keeps_qlen_only_on_cpu():
    case = _case(2, bs=2, n=3, max_prefix=5)
    qlen, args = case.qlen_mask(), (case.seq_lens, case.n, sum(case.prefix_lens))
    assert verify_custom_mask(qlen, *args, TreeMaskLayout.QLEN_ONLY) is qlen
    assert torch.equal(verify_custom_mask(qlen, *args, TreeMaskLayout.FULL), case.full_mask())


# -- (c) the CPU twin: both layouts attend alike under the specsot_cpu backend's reading --------


@pytest.mark.parametrize("bs", range(1, 9))
def test_full_layout_and_qlen_only_attend_alike_on_cpu(bs):
    case = _case(100 + bs, bs=bs, n=random.Random(bs).choice([2, 4, 6, 8]), max_prefix=24)
    want = _dense_attention(case, _true_rows(case))
    for mask in (case.qlen_mask(), case.full_mask(), case.full_mask(bound=11)):
        rows = _cpu_backend_rows(case, mask)
        assert all(torch.equal(a, b) for a, b in zip(rows, _true_rows(case)))
        torch.testing.assert_close(_dense_attention(case, rows), want, rtol=0, atol=0)


# -- (a), (b) SGLang's Triton extend-attention kernel, interpreted on CPU -----------------------


def _kernel_run(case: Case, custom_mask: torch.Tensor, skip_prefix_custom_mask: bool) -> dict:
    """The kernel's arguments for `case`, its prefix K/V in a KV pool at shuffled slots."""
    total = sum(case.prefix_lens)
    slots = torch.randperm(total + 8, generator=torch.Generator().manual_seed(total))[:total]
    k_buffer = torch.zeros(total + 8, KV_HEADS, HEAD_DIM)
    v_buffer = torch.zeros_like(k_buffer)
    if total:
        k_buffer[slots], v_buffer[slots] = torch.cat(case.k_prefix), torch.cat(case.v_prefix)
    kv_indptr = torch.zeros(case.bs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(case.seq_lens, 0)
    return {
        "q": case.q, "k": case.k, "v": case.v, "k_buffer": k_buffer, "v_buffer": v_buffer,
        "qo_indptr": torch.arange(0, (case.bs + 1) * case.n, case.n, dtype=torch.int32),
        "kv_indptr": kv_indptr, "kv_indices": slots.to(torch.int64),
        "custom_mask": custom_mask, "mask_indptr": full_layout_indptr(case.seq_lens, case.n),
        "n": case.n, "sm_scale": SCALE, "skip_prefix_custom_mask": skip_prefix_custom_mask,
    }  # fmt: skip


def _qlen_padded_as_flashinfer_reads_it(case: Case) -> torch.Tensor:
    """Today's QLEN_ONLY mask after `generate_attn_arg_prefill` pads it to the FULL size with
    True (eagle_info.py:134-151): in bounds for the kernel, but misaligned."""
    qlen = case.qlen_mask()
    short = int(full_layout_indptr(case.seq_lens, case.n)[-1]) - qlen.numel()
    return torch.cat((qlen, torch.ones(short, dtype=torch.bool)))


@pytest.fixture(scope="module")
def kernel_outputs(tmp_path_factory):
    """(case, SGLang kernel output with the FULL mask, with the padded QLEN_ONLY mask) per case."""
    cases = [_case(seed, *shape) for seed, shape in enumerate(KERNEL_CASES)]
    runs = []
    for i, case in enumerate(cases):
        # The backend skips the prefix columns (extend_attention.py:934, 546); reading them
        # too, as FlashInfer does, checks they are all True.
        runs.append(_kernel_run(case, case.full_mask(bound=3 * (i % 2)), skip_prefix_custom_mask=i % 2 == 0))
        runs.append(_kernel_run(case, _qlen_padded_as_flashinfer_reads_it(case), skip_prefix_custom_mask=True))
    tmp = tmp_path_factory.mktemp("triton-interpret")
    torch.save(runs, tmp / "runs.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _KERNEL_RUNNER, str(tmp / "runs.pt"), str(tmp / "outs.pt")],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, f"SGLang's extend kernel under TRITON_INTERPRET failed:\n{proc.stderr[-4000:]}"
    outs = torch.load(tmp / "outs.pt")
    return [(case, outs[2 * i], outs[2 * i + 1]) for i, case in enumerate(cases)]


def test_full_layout_mask_gives_sglangs_triton_kernel_the_tree_attention(kernel_outputs):
    for case, full_out, _ in kernel_outputs:
        want = _dense_attention(case, _true_rows(case)).float()
        torch.testing.assert_close(full_out, want, rtol=0, atol=KERNEL_TOL, msg=f"case {case.prefix_lens}")


def test_full_layout_read_of_a_qlen_only_mask_is_the_defect(kernel_outputs):
    # The worker's QLEN_ONLY mask handed to a FULL reader: the kernel's last read
    # (mask_indptr[bs] - 1) lies past the tensor, and padded as FlashInfer pads it the
    # attention is wrong wherever a request has a prefix.
    with_prefix = [(case, out) for case, _, out in kernel_outputs if any(case.prefix_lens)]
    assert len(with_prefix) >= 3, "the kernel cases lost their prefixes"
    for case, qlen_out in with_prefix:
        assert case.qlen_mask().numel() < int(full_layout_indptr(case.seq_lens, case.n)[-1])
        error = (qlen_out - _dense_attention(case, _true_rows(case)).float()).abs().max()
        assert error > 100 * KERNEL_TOL, f"case {case.prefix_lens}: the misread mask attended correctly"


def test_hidden_rows_follow_the_accepted_paths():
    """An EAGLE head's draft-extend reads row j as the target's hidden state at the j-th node of
    the accepted path (speculative/verify_input.along_accepted_paths), whatever the tree order."""
    import torch

    from sglang_specsot.speculative.verify_input import along_accepted_paths

    n = 3
    rows = torch.arange(2 * n, dtype=torch.float32).unsqueeze(1).repeat(1, 4)  # row value = its global node
    accept_index = torch.tensor([[0, 2, -1], [3, 4, 5]])  # request 0 accepted node 2 (a second child)
    out = along_accepted_paths(rows, accept_index)
    assert out[:, 0].tolist() == [0, 2, 0, 3, 4, 5] and out.shape == rows.shape


@pytest.mark.parametrize("seed", range(10))
def test_the_device_built_mask_is_the_host_trees_ancestor_mask(seed):
    # build_verify_input builds the mask from the parents on the device; it must be the
    # host's ancestor-or-self mask of every (branching, padded) tree, cell for cell.
    rng = random.Random(seed)
    n, bs = rng.choice([1, 2, 4, 8, 16]), rng.randrange(1, 6)
    trees = [random_tree(rng, n) for _ in range(bs)]
    parents = torch.tensor([t.parents for t in trees], dtype=torch.int64)
    want = torch.tensor([tree_mask(t, n) for t in trees], dtype=torch.bool).flatten()
    assert torch.equal(ancestor_mask(parents, max(t.height for t in trees)), want)
