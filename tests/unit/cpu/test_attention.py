"""`specsot_cpu` attention against a dense-mask reference, and its SGLang wiring.

Every case writes random K/V into a real float16 SGLang KV pool through a scattered
(`req_to_token` rows point at shuffled slots, request pool rows out of order) layout, runs the
backend as a model layer would, and compares with attention computed in float64 from the same
float16-rounded K/V under a mask built here, independently, from the case's structure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang_specsot.cpu.attention import (
    BACKEND_NAME,
    SpecSoTCpuAttnBackend,
    register_cpu_attention_backend,
    verify_window_masks,
)
from sglang_specsot.cpu.draft_attention import SpecSoTCpuMultiStepDraftBackend
from tests.unit import cpu_checks

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 16  # GQA: two query heads per KV head
POOL_SLOTS, MAX_REQS, MAX_CONTEXT = 1024, 8, 160
REQ_POOL_ROWS = [5, 2, 7, 0]  # request i lives in req_to_token row REQ_POOL_ROWS[i]
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


@dataclass
class World:
    """A KV pool, a req_to_token table and the ground-truth K/V of every request's sequence."""

    runner: SimpleNamespace
    layer: RadixAttention
    gen: torch.Generator
    keys: dict[int, torch.Tensor] = field(default_factory=dict)  # req -> (L, kv_heads, dim)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    free_slots: list[int] = field(default_factory=list)

    @property
    def req_to_token(self) -> torch.Tensor:
        return self.runner.req_to_token_pool.req_to_token

    @property
    def kv_pool(self) -> MHATokenToKVPool:
        return self.runner.token_to_kv_pool

    def map_slots(self, req: int, start: int, count: int) -> torch.Tensor:
        """Give positions [start, start+count) of `req` fresh, scattered pool slots."""
        slots = torch.tensor([self.free_slots.pop() for _ in range(count)], dtype=torch.int64)
        self.req_to_token[REQ_POOL_ROWS[req], start : start + count] = slots.to(torch.int32)
        return slots

    def randn(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen)

    def new_kv(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.randn(count, NUM_KV_HEADS, HEAD_DIM), self.randn(count, NUM_KV_HEADS, HEAD_DIM))

    def write_prefix(self, req: int, length: int) -> None:
        """A cached prefix: KV already in the pool (as an earlier forward would have left it)."""
        slots = self.map_slots(req, 0, length)
        k, v = self.new_kv(length)
        self.kv_pool.set_kv_buffer(self.layer, slots, k, v)
        self.keys[req], self.values[req] = k, v

    def append(self, req: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.keys[req] = torch.cat((self.keys.get(req, k[:0]), k))
        self.values[req] = torch.cat((self.values.get(req, v[:0]), v))


def make_world(seed: int = 0) -> World:
    gen = torch.Generator().manual_seed(seed)
    kv_pool = MHATokenToKVPool(
        POOL_SLOTS, 1, torch.float16, NUM_KV_HEADS, HEAD_DIM, 1, "cpu", False
    )
    runner = SimpleNamespace(
        device="cpu",
        req_to_token_pool=ReqToTokenPool(MAX_REQS, MAX_CONTEXT, "cpu", False),
        token_to_kv_pool=kv_pool,
        page_size=1,
    )
    layer = RadixAttention(NUM_HEADS, HEAD_DIM, HEAD_DIM**-0.5, NUM_KV_HEADS, layer_id=0)
    free = torch.randperm(POOL_SLOTS, generator=gen)[: POOL_SLOTS - 8] + 1  # slot 0 is padding
    return World(runner, layer, gen, free_slots=free.tolist())


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor):
    """Dense attention in float64 over float16-rounded K/V; q (T, H, D), visible (T, L) bool."""
    k = keys.to(torch.float16).double().repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1)
    v = values.to(torch.float16).double().repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1)
    scores = torch.einsum("thd,lhd->htl", q.double(), k) * HEAD_DIM**-0.5
    scores = scores.masked_fill(~visible.unsqueeze(0), float("-inf"))
    return torch.einsum("htl,lhd->thd", scores.softmax(-1), v)


def causal_visible(prefix: int, new: int) -> torch.Tensor:
    return torch.tensor([[c <= prefix + i for c in range(prefix + new)] for i in range(new)])


def random_tree(n: int, gen: torch.Generator) -> list[int]:
    """Parent of each node of a draft tree; node 0 is the root (the bonus token)."""
    return [-1] + [int(torch.randint(0, j, (1,), generator=gen)) for j in range(1, n)]


def ancestors_visible(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    visible = torch.zeros((n, n), dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            visible[i, j] = True
            j = parents[j]
    return visible


def batch(mode, world, seq_lens, out_cache_loc, spec_info=None, prefix=None, extend=None):
    bs = len(seq_lens)
    return SimpleNamespace(
        forward_mode=mode,
        batch_size=bs,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        req_pool_indices=torch.tensor(REQ_POOL_ROWS[:bs], dtype=torch.int64),
        out_cache_loc=out_cache_loc,
        encoder_lens=None,
        spec_info=spec_info,
        extend_prefix_lens=None if prefix is None else torch.tensor(prefix, dtype=torch.int32),
        extend_seq_lens=None if extend is None else torch.tensor(extend, dtype=torch.int32),
        extend_prefix_lens_cpu=prefix,
        extend_seq_lens_cpu=extend,
    )


def run_window(world, backend, mode, prefix_lens, new_lens, q_dtype, spec_info=None):
    """Write each request's new K/V at positions after its prefix and attend; returns (q, out)."""
    locs, ks, vs = [], [], []
    for req, (prefix, new) in enumerate(zip(prefix_lens, new_lens)):
        locs.append(world.map_slots(req, prefix, new))
        k, v = world.new_kv(new)
        world.append(req, k, v)
        ks.append(k), vs.append(v)
    total = sum(new_lens)
    q = world.randn(total, NUM_HEADS * HEAD_DIM).to(q_dtype)
    k, v = torch.cat(ks).to(q_dtype), torch.cat(vs).to(q_dtype)
    if mode.is_target_verify():
        fb = batch(mode, world, prefix_lens, torch.cat(locs), spec_info)
    else:
        seq_lens = [p + n for p, n in zip(prefix_lens, new_lens)]
        fb = batch(mode, world, seq_lens, torch.cat(locs), spec_info, prefix_lens, new_lens)
    backend.init_forward_metadata(fb)
    out = backend.forward(q, k, v, world.layer, fb)
    return q.view(total, NUM_HEADS, HEAD_DIM), out.view(total, NUM_HEADS, HEAD_DIM)


def assert_close(out, want, q_dtype):
    err = (out.double() - want).abs().max().item()
    assert err < TOL[q_dtype], f"max abs error {err:.3g} >= {TOL[q_dtype]}"


def check_rows(world, q, out, prefix_lens, new_lens, window_visible, q_dtype):
    start = 0
    for req, (prefix, new) in enumerate(zip(prefix_lens, new_lens)):
        visible = torch.cat((torch.ones((new, prefix), dtype=torch.bool), window_visible[req]), 1)
        want = reference(q[start : start + new], world.keys[req], world.values[req], visible)
        assert_close(out[start : start + new], want, q_dtype)
        start += new


# --- extend and decode -------------------------------------------------------------------------


@pytest.mark.parametrize("bs", [1, 3])
@pytest.mark.parametrize("cached", [False, True], ids=["fresh", "prefix-cached"])
def test_extend(bs, cached):
    world = make_world(bs)
    backend = SpecSoTCpuAttnBackend(world.runner)
    prefix_lens = [0] * bs if not cached else [7, 30, 1][:bs]
    for req, prefix in enumerate(prefix_lens):
        if prefix:
            world.write_prefix(req, prefix)
    new_lens = [9, 4, 13][:bs]
    q, out = run_window(world, backend, ForwardMode.EXTEND, prefix_lens, new_lens, torch.float32)
    windows = [causal_visible(0, n) for n in new_lens]
    check_rows(world, q, out, prefix_lens, new_lens, windows, torch.float32)


@pytest.mark.parametrize("bs", [1, 3])
def test_decode(bs):
    world = make_world(10 + bs)
    backend = SpecSoTCpuAttnBackend(world.runner)
    prefix_lens = [12, 40, 3][:bs]
    for req, prefix in enumerate(prefix_lens):
        world.write_prefix(req, prefix)
    q, out = run_window(world, backend, ForwardMode.DECODE, prefix_lens, [1] * bs, torch.float32)
    check_rows(world, q, out, prefix_lens, [1] * bs, [torch.ones(1, 1, dtype=torch.bool)] * bs, torch.float32)


@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_decode_is_torch_natives_bit_for_bit(q_dtype):
    """Plain decoding's numerics are torch_native's: the plan changes where the slot lists are
    built (once per forward), not what SDPA sees, so plain servers decode as on torch_native."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    world = make_world(21)
    prefix_lens = [12, 40, 3]
    for req, prefix in enumerate(prefix_lens):
        world.write_prefix(req, prefix)
    locs = torch.cat([world.map_slots(req, prefix, 1) for req, prefix in enumerate(prefix_lens)])
    q = world.randn(3, NUM_HEADS * HEAD_DIM).to(q_dtype)
    k, v = (t.to(q_dtype) for t in world.new_kv(3))
    fb = batch(ForwardMode.DECODE, world, [p + 1 for p in prefix_lens], locs)
    outs = []
    for backend in (SpecSoTCpuAttnBackend(world.runner), TorchNativeAttnBackend(world.runner)):
        backend.init_forward_metadata(fb)
        outs.append(backend.forward(q, k, v, world.layer, fb))
    assert outs[0].dtype == outs[1].dtype == q_dtype
    assert torch.equal(outs[0], outs[1])


# --- target verify -----------------------------------------------------------------------------


def verify_input(n, custom_mask=None, tree_topk=1):
    return SimpleNamespace(draft_token_num=n, custom_mask=custom_mask, tree_topk=tree_topk)


@pytest.mark.parametrize("bs", [1, 3])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_target_verify_chain(bs, q_dtype):
    world, n = make_world(20 + bs), 5
    backend = SpecSoTCpuAttnBackend(world.runner)
    prefix_lens = [17, 3, 50][:bs]
    for req, prefix in enumerate(prefix_lens):
        world.write_prefix(req, prefix)
    # EAGLE topk=1 sends its (causal) mask too; the backend must not need it.
    spec = verify_input(n, torch.ones(bs * n * n, dtype=torch.bool), tree_topk=1)
    q, out = run_window(world, backend, ForwardMode.TARGET_VERIFY, prefix_lens, [n] * bs, q_dtype, spec)
    check_rows(world, q, out, prefix_lens, [n] * bs, [causal_visible(0, n)] * bs, q_dtype)


def full_mask_layout(trees: list[torch.Tensor], prefix_lens: list[int]) -> torch.Tensor:
    """FULL_MASK: per request, N rows of [prefix columns | tree columns], flattened."""
    return torch.cat(
        [torch.cat((torch.ones(t.shape[0], p, dtype=torch.bool), t), 1).flatten() for t, p in zip(trees, prefix_lens)]
    )


@pytest.mark.parametrize("bs", [1, 3])
@pytest.mark.parametrize("layout", ["qlen_only", "full_mask"])
@pytest.mark.parametrize("tree_topk", [4, -1], ids=["eagle-topk4", "ngram"])
def test_target_verify_tree(bs, layout, tree_topk):
    world, n = make_world(30 + bs), 8
    backend = SpecSoTCpuAttnBackend(world.runner)
    prefix_lens = [9, 26, 2][:bs]
    for req, prefix in enumerate(prefix_lens):
        world.write_prefix(req, prefix)
    trees = [ancestors_visible(random_tree(n, world.gen)) for _ in range(bs)]
    assert any(not torch.equal(t, causal_visible(0, n)) for t in trees), "tree must not be a chain"
    mask = torch.cat([t.flatten() for t in trees]) if layout == "qlen_only" else full_mask_layout(trees, prefix_lens)
    spec = verify_input(n, mask, tree_topk=tree_topk)
    q, out = run_window(world, backend, ForwardMode.TARGET_VERIFY, prefix_lens, [n] * bs, torch.float32, spec)
    check_rows(world, q, out, prefix_lens, [n] * bs, trees, torch.float32)


def test_verify_chain_matches_decode_steps():
    """A chain verify forward gives each row what one decode forward per token gives it."""
    n, prefix = 6, 21
    world_v, world_d = make_world(40), make_world(40)
    for world in (world_v, world_d):
        world.write_prefix(0, prefix)
    q, verify_out = run_window(
        world_v, SpecSoTCpuAttnBackend(world_v.runner), ForwardMode.TARGET_VERIFY,
        [prefix], [n], torch.float32, verify_input(n),
    )  # fmt: skip
    decode = SpecSoTCpuAttnBackend(world_d.runner)
    k_all, v_all = world_v.keys[0][prefix:], world_v.values[0][prefix:]
    for i in range(n):
        loc = world_d.map_slots(0, prefix + i, 1)
        fb = batch(ForwardMode.DECODE, world_d, [prefix + i + 1], loc)
        decode.init_forward_metadata(fb)
        row = decode.forward(q[i].reshape(1, -1), k_all[i : i + 1], v_all[i : i + 1], world_d.layer, fb)
        err = (row.view(NUM_HEADS, HEAD_DIM) - verify_out[i]).abs().max().item()
        assert err < 1e-6, f"verify row {i} differs from its decode step by {err:.3g}"


def test_verify_mask_of_wrong_size_is_rejected():
    with pytest.raises(ValueError, match="fits neither"):
        verify_window_masks(torch.ones(7, dtype=torch.bool), [3, 4], 2)


# --- draft extend and multi-step draft decode --------------------------------------------------


@pytest.mark.parametrize("bs", [1, 3])
def test_draft_extend_v2(bs):
    """prepare_for_draft_extend: prefix = seq_lens, N window rows, seq_lens + N seen."""
    world, n = make_world(50 + bs), 4
    backend = SpecSoTCpuAttnBackend(world.runner)
    prefix_lens = [11, 5, 33][:bs]
    for req, prefix in enumerate(prefix_lens):
        world.write_prefix(req, prefix)
    q, out = run_window(world, backend, ForwardMode.DRAFT_EXTEND_V2, prefix_lens, [n] * bs, torch.float32)
    check_rows(world, q, out, prefix_lens, [n] * bs, [causal_visible(0, n)] * bs, torch.float32)


@pytest.mark.parametrize("bs", [1, 3])
@pytest.mark.parametrize("topk", [1, 3])
def test_multi_step_draft_decode(bs, topk):
    world, num_steps = make_world(60 + bs * topk), 4
    drafter = SpecSoTCpuMultiStepDraftBackend(world.runner, topk, num_steps)
    assert len(drafter.attn_backends) == num_steps - 1
    prefix_lens = [14, 6, 29][:bs]
    branch_slots = {}  # (req, branch) -> slots of steps 0..num_steps-1
    for req, prefix in enumerate(prefix_lens):
        world.write_prefix(req, prefix)
        slots = world.map_slots(req, prefix, topk * num_steps).view(topk, num_steps)
        for t in range(topk):
            branch_slots[req, t] = slots[t]
    rows = [(req, t) for req in range(bs) for t in range(topk)]  # row order b * topk + t
    fb = batch(ForwardMode.DECODE, world, prefix_lens, None)
    drafter.init_forward_metadata(fb)
    branch_kv = {row: ([], []) for row in rows}
    for step, step_backend in enumerate(drafter.attn_backends):
        fb.out_cache_loc = torch.stack([branch_slots[row][step] for row in rows])
        k, v = world.new_kv(len(rows))
        q = world.randn(len(rows), NUM_HEADS * HEAD_DIM)
        out = step_backend.forward(q, k, v, world.layer, fb).view(len(rows), NUM_HEADS, HEAD_DIM)
        for i, (req, t) in enumerate(rows):
            branch_kv[req, t][0].append(k[i])
            branch_kv[req, t][1].append(v[i])
            keys = torch.cat((world.keys[req], torch.stack(branch_kv[req, t][0])))
            values = torch.cat((world.values[req], torch.stack(branch_kv[req, t][1])))
            visible = torch.ones((1, keys.shape[0]), dtype=torch.bool)
            want = reference(q[i].view(1, NUM_HEADS, HEAD_DIM), keys, values, visible)
            assert_close(out[i : i + 1], want, torch.float32)


def test_tree_draft_with_pages_is_refused():
    world = make_world(75)
    world.runner.page_size = 4
    with pytest.raises(NotImplementedError, match="page-size 1"):
        SpecSoTCpuMultiStepDraftBackend(world.runner, topk=2, speculative_num_steps=3)
    assert SpecSoTCpuMultiStepDraftBackend(world.runner, topk=1, speculative_num_steps=3)


def test_idle_batch():
    world = make_world(70)
    backend = SpecSoTCpuAttnBackend(world.runner)
    drafter = SpecSoTCpuMultiStepDraftBackend(world.runner, 2, 3)
    fb = batch(ForwardMode.IDLE, world, [], torch.empty(0, dtype=torch.int64))
    backend.init_forward_metadata(fb)
    drafter.init_forward_metadata(fb)
    q = torch.empty(0, NUM_HEADS * HEAD_DIM)
    k = v = torch.empty(0, NUM_KV_HEADS, HEAD_DIM)
    assert backend.forward(q, k, v, world.layer, fb).shape == (0, NUM_HEADS * HEAD_DIM)
    assert drafter.attn_backends[0].forward(q, k, v, world.layer, fb).shape == (0, NUM_HEADS * HEAD_DIM)


# --- wiring into SGLang ------------------------------------------------------------------------


def test_registration_is_idempotent():
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    register_cpu_attention_backend()
    register_cpu_attention_backend()
    assert ATTENTION_BACKEND_CHOICES.count(BACKEND_NAME) == 1
    world = make_world(80)
    assert isinstance(ATTENTION_BACKENDS[BACKEND_NAME](world.runner), SpecSoTCpuAttnBackend)


# In a CPU-engine process (the one the unit tests share): the host changes apply and the draft
# backend factory returns our backends.
FACTORY_PROBE = cpu_checks.add("draft-backend-factory", r"""
import sys
from types import SimpleNamespace
import torch
from sglang_specsot.cpu.attention import register_cpu_attention_backend
from sglang_specsot.wiring import apply_host_changes
register_cpu_attention_backend()
applied = apply_host_changes()
import sglang.srt.speculative.draft_utils as draft_utils
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
# The factory reads the published server config; give it the pair a launched server would
# (and put SGLang's own back after: the process is shared).
published = draft_utils.attention_backends, draft_utils.get_spec
draft_utils.attention_backends = lambda: ("specsot_cpu", "specsot_cpu")
draft_utils.get_spec = lambda: SimpleNamespace(speculative_attention_mode="prefill")
config = SimpleNamespace(hf_config=SimpleNamespace(), hf_text_config=SimpleNamespace())
runner = SimpleNamespace(
    device="cpu", draft_attention_backend=None, model_config=config, page_size=1,
    req_to_token_pool=ReqToTokenPool(4, 64, "cpu", False),
    token_to_kv_pool=MHATokenToKVPool(64, 1, torch.float16, 2, 16, 1, "cpu", False),
)
try:
    factory = draft_utils.DraftBackendFactory(runner, topk=2, speculative_num_steps=3)
    decode, extend = factory.create_decode_backend(), factory.create_draft_extend_backend()
    runner.draft_attention_backend = "no_such_backend"
    try:
        draft_utils.DraftBackendFactory(runner, topk=2, speculative_num_steps=3).create_decode_backend()
        other = "built"
    except ValueError as exc:
        other = str(exc)
finally:
    draft_utils.attention_backends, draft_utils.get_spec = published
from sglang.srt.mem_cache import allocation
req_to_token = torch.arange(12, dtype=torch.int32).view(3, 4)
last_loc = allocation.get_last_loc(req_to_token, torch.tensor([2, 0]), torch.tensor([3, 0]))
result = {
    "applied": applied, "last_loc": last_loc.tolist(),
    "sgl_kernel": sys.modules["sgl_kernel"].__name__ if "sgl_kernel" in sys.modules else None,
    "decode": type(decode).__name__, "steps": [type(b).__name__ for b in decode.attn_backends],
    "decode_stamp": decode.decode_attention_backend_str,
    "extend": type(extend).__name__, "extend_stamp": extend.prefill_attention_backend_str,
    "other_backend": other,
}
""")  # fmt: skip


def test_host_change_wires_draft_backend_factory(cpu_process):
    """In a CPU-engine process the host changes apply and the factory returns our backends."""
    result = cpu_process(FACTORY_PROBE)
    assert {"draft-backend-factory-specsot-cpu", "last-loc-torch-on-cpu"} <= set(result["applied"])
    # get_last_loc answers on CPU (its Triton kernel would need a GPU driver): slot before prefix.
    assert result["last_loc"] == [10, -1]
    assert result["decode"] == "SpecSoTCpuMultiStepDraftBackend"
    assert result["steps"] == ["SpecSoTCpuDraftStepBackend"] * 2
    assert result["decode_stamp"] == BACKEND_NAME
    assert result["extend"] == "SpecSoTCpuAttnBackend"
    assert result["extend_stamp"] == BACKEND_NAME
    # Any other name still meets SGLang's own map and its error.
    assert result["other_backend"] == "EAGLE is not supported in decode attention backend no_such_backend"
