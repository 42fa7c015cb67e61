"""Int8 draft weights on CPU: exact per-row quantization, both int8 kernels, the plan of kernels
by row count and its dispatch, which layers are given a copy, and the mode switch."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod, UnquantizedLinearMethod

from sglang_specsot.cpu import draft_int8
from sglang_specsot.cpu.draft_int8 import (
    DRAFT_INT8_ENV, dense_layers, draft_int8_mode, int8_linear, pack_w8a8, plan_from_times, plan_ranges,
    quantize_draft, quantize_rows, w8a8_available, w8a8_linear, w8a8_reduce_range,
)  # fmt: skip

needs_fbgemm = pytest.mark.skipif(not w8a8_available(), reason="torch has no fbgemm engine here")


class _Linear(torch.nn.Module):
    """The shape of an SGLang linear layer: a weight, and a quant method that multiplies."""

    def __init__(self, n: int, k: int, bias: bool = False):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, k, dtype=torch.bfloat16) * 0.1, requires_grad=False)
        self.bias = torch.nn.Parameter(torch.randn(n, dtype=torch.bfloat16), requires_grad=False) if bias else None
        self.quant_method = UnquantizedLinearMethod()

    def forward(self, x):
        return self.quant_method.apply(self, x, self.bias)


class _Embedding(torch.nn.Module):
    def __init__(self, n: int, k: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, k, dtype=torch.bfloat16), requires_grad=False)
        self.quant_method = UnquantizedEmbeddingMethod()


class _Draft(torch.nn.Module):
    def __init__(self, tied: bool = True):
        super().__init__()
        self.embed_tokens = _Embedding(64, 16)
        self.up = _Linear(32, 16, bias=True)
        self.down = _Linear(16, 32)
        self.lm_head = self.embed_tokens if tied else _Embedding(64, 16)


def test_per_row_quantization_is_within_half_a_step_of_every_weight():
    w = torch.randn(48, 40) * torch.linspace(0.01, 3.0, 48)[:, None]  # rows of very different range
    q, s = quantize_rows(w)
    assert q.dtype == torch.int8 and s.shape == (48,) and int(q.abs().max()) == 127
    assert torch.all((q.float() * s[:, None] - w).abs() <= s[:, None] / 2 + 1e-6)


def test_an_all_zero_row_quantizes_to_zeros_not_nan():
    q, s = quantize_rows(torch.zeros(3, 8))
    assert torch.all(q == 0) and torch.all(torch.isfinite(s))


def test_the_int8_product_is_the_product_with_the_dequantized_weights():
    w, b = torch.randn(24, 32, dtype=torch.bfloat16), torch.randn(24, dtype=torch.bfloat16)
    q, s = quantize_rows(w)
    x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    expected = x.float() @ (q.float() * s.float()[:, None]).T + b.float()
    out = int8_linear(x, q, s, b)
    assert out.shape == (2, 3, 24) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=0.1, rtol=0.02)


@needs_fbgemm
def test_the_w8a8_product_is_the_dequantized_product_within_its_activations_rounding():
    w, b = torch.randn(24, 32, dtype=torch.bfloat16), torch.randn(24, dtype=torch.bfloat16)
    x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    packed = pack_w8a8(w)
    out = w8a8_linear(x, packed, b)
    assert out.shape == (2, 3, 24) and out.dtype == torch.bfloat16
    # The int8 weights the kernel holds, de-quantized: their own rounding is not the kernel's.
    wq, _ = torch.ops.quantized.linear_unpack(packed)
    w_exact = wq.int_repr().double() * wq.q_per_channel_scales().double()[:, None]
    product = x.double() @ w_exact.T
    # One step for the call's activations: the range of x and 0 over 255 levels (127 where the
    # kernel would overflow). Each activation moves at most half a step, so output j at most
    # step / 2 * sum_k |w_jk| (and float32's rounding of the kernel's integer sums, each under
    # `levels` steps per unit of weight); bf16 then rounds the product and its sum with the
    # bias, each by at most u = 2^-8 of itself.
    levels = 127 if w8a8_reduce_range() else 255
    step = float(x.max().clamp_min(0) - x.min().clamp_max(0)) / levels
    u = 2.0**-8
    rounding = step * w_exact.abs().sum(1) * (0.5 + levels * 2.0**-22)
    bound = (rounding * (1 + u) + u * product.abs()) * (1 + u) + u * (product + b.double()).abs()
    assert torch.all((out.double() - product - b.double()).abs() <= bound)


@needs_fbgemm
def test_the_largest_activations_times_the_largest_weights_do_not_overflow():
    # Activations at the top of their range (uint8 255) times weights of 127 add a pair at a
    # time past int16 on kernels without VNNI, which therefore take 7-bit activations.
    ones = torch.ones(1, 64)
    for sign in (1.0, -1.0):
        out = w8a8_linear(ones, pack_w8a8(sign * torch.ones(8, 64)), None)
        torch.testing.assert_close(out, torch.full((1, 8), sign * 64.0))


# fbgemm on an AVX2-only machine (FBGEMM_ENABLE_INSTRUCTIONS caps the kernels it picks): 8-bit
# activations overflow there, and the products taken (7-bit) stay within their bound.
_AVX2_KERNEL = """
import torch
from sglang_specsot.cpu.draft_int8 import pack_w8a8, w8a8_error, w8a8_linear, w8a8_reduce_range
torch.manual_seed(0)
ones, packed = torch.ones(1, 64), pack_w8a8(torch.ones(8, 64))
eight_bit = float(torch.ops.quantized.linear_dynamic(ones, packed, False).min())
taken = float(w8a8_linear(ones, packed, None).min())
print(w8a8_reduce_range(), eight_bit, taken, w8a8_error(torch.randn(64, 256, dtype=torch.bfloat16)))
"""


@needs_fbgemm
def test_on_an_avx2_kernel_w8a8_takes_7_bit_activations_and_stays_within_its_bound():
    env = {**os.environ, "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
    out = subprocess.run([sys.executable, "-c", _AVX2_KERNEL], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    reduce_range, eight_bit, taken, error = out.stdout.split()
    assert reduce_range == "True" and float(eight_bit) < 60  # 8 bits: int16 saturated (~32.4)
    assert float(taken) == 64.0 and float(error) <= 1


def test_the_plan_takes_the_fastest_kernel_per_row_count():
    def t(dense, int8, w8a8):
        return {"dense": dense, "int8": int8, "w8a8": w8a8}

    plan = plan_from_times({1: t(2.0, 1.0, 0.5), 2: t(2.0, 1.0, 0.95), 4: t(2.0, 3.0, 1.0), 8: t(2.0, 3.0, 2.5)})
    # 1: w8a8 well ahead of int8; 2: within the margin, so int8 (its answers are finer);
    # 3 and 4: w8a8 (int8 lost to dense); 5..8: dense, at 8 nothing beat it.
    assert plan == ("w8a8", "int8", "w8a8", "w8a8", "dense", "dense", "dense", "dense")
    assert plan_from_times({1: t(1.0, 1.0, 2.0)}) == ("dense",)  # a tie is no win
    assert plan_from_times({1: {"dense": 2.0, "int8": 1.0}}) == ("int8",)  # no fbgemm here
    assert plan_ranges(plan) == [["w8a8", 1, 1], ["int8", 2, 2], ["w8a8", 3, 4], ["dense", 5, 8]]


def test_dense_layers_are_the_linears_and_the_head_once_not_other_embeddings():
    tied = _Draft(tied=True)
    assert dense_layers(tied) == [tied.embed_tokens, tied.up, tied.down]  # the tied head is the embedding
    untied = _Draft(tied=False)
    assert dense_layers(untied) == [untied.up, untied.down, untied.lm_head]
    shared = {untied.up.weight.data_ptr()}  # a weight the target owns too is never touched
    assert dense_layers(untied, exclude=shared) == [untied.down, untied.lm_head]


def test_a_layer_whose_inputs_are_off_the_kernels_vector_width_is_left_alone():
    model = _Draft(tied=False)
    model.odd = _Linear(32, 17)  # K = 17: the int8 kernel crashes the process on such a shape
    assert model.odd not in dense_layers(model) and model.up in dense_layers(model)


def _plan(*kernels):
    return lambda weight, rows, sweeps, w8a8=True: tuple(kernels)


def test_quantized_layers_use_their_plans_kernel_by_row_count(monkeypatch):
    plan = ("int8", "int8", "w8a8", "dense") if w8a8_available() else ("int8", "int8", "dense", "dense")
    monkeypatch.setattr(draft_int8, "kernel_plan", _plan(*plan))
    model = _Draft(tied=False)
    summary = quantize_draft(model)
    assert summary.layers == 3 and summary.kernels_by_shape["32x16"] == plan_ranges(plan)
    up = model.up
    # SGLang's type checks still see the method they built; only apply changed.
    assert isinstance(up.quant_method, UnquantizedLinearMethod)
    assert type(up.quant_method).__name__ == "Int8DraftUnquantizedLinearMethod"
    up.specsot_int8 = torch.zeros_like(up.specsot_int8)  # make the int8 path recognisable
    two, four = torch.randn(2, 16, dtype=torch.bfloat16), torch.randn(4, 16, dtype=torch.bfloat16)
    assert torch.equal(up(two), up.bias.expand(2, 32))  # int8 (zeros) plus bias
    torch.testing.assert_close(up(four), torch.nn.functional.linear(four, up.weight, up.bias))
    five = torch.randn(5, 16, dtype=torch.bfloat16)  # beyond the plan: the weights as loaded
    torch.testing.assert_close(up(five), torch.nn.functional.linear(five, up.weight, up.bias))
    if w8a8_available():
        three = torch.randn(3, 16, dtype=torch.bfloat16)
        torch.testing.assert_close(up(three), w8a8_linear(three, up.specsot_w8a8, up.bias))
    # The head keeps its embedding lookup and multiplies through the same dispatch.
    head = model.lm_head
    assert isinstance(head.quant_method, UnquantizedEmbeddingMethod)
    ids = torch.tensor([3, 5])
    assert torch.equal(head.quant_method.embedding(head, ids), head.weight[ids])


def test_a_shape_whose_plan_is_dense_keeps_its_method(monkeypatch):
    monkeypatch.setattr(
        draft_int8, "kernel_plan", lambda weight, rows, sweeps, w8a8: ("dense",) if weight.shape[0] == 16 else ("int8",)
    )
    model = _Draft(tied=False)
    summary = quantize_draft(model)
    assert type(model.down.quant_method) is UnquantizedLinearMethod and not hasattr(model.down, "specsot_int8")
    assert not hasattr(model.up, "specsot_w8a8")  # only the copies the plan uses
    assert summary.layers == 2 and summary.kernels_by_shape["16x32"] == [["dense", 1, 1]]


def test_unmeasured_every_shape_uses_the_forced_kernel_up_to_the_largest_row_count(monkeypatch):
    monkeypatch.setattr(draft_int8, "kernel_plan", lambda *a: pytest.fail("unmeasured means no timing"))
    summary = quantize_draft(_Draft(tied=True), rows=(1, 2, 3), measured=False)
    assert summary.layers == 3 and all(r == [["int8", 1, 3]] for r in summary.kernels_by_shape.values())
    # The weight-only kernel only as wide as it is ever measured fastest; dense above.
    summary = quantize_draft(_Draft(tied=True), rows=(1, 2, 8), measured=False)
    assert draft_int8.INT8_FORCED_ROWS == 4
    assert all(r == [["int8", 1, 4], ["dense", 5, 8]] for r in summary.kernels_by_shape.values())
    if w8a8_available():
        summary = quantize_draft(_Draft(tied=True), rows=(1, 2, 8), measured=False, forced="w8a8")
        assert all(r == [["w8a8", 1, 8]] for r in summary.kernels_by_shape.values())


@needs_fbgemm
def test_auto_takes_w8a8_only_where_its_products_stay_within_their_bound(monkeypatch, caplog):
    fastest = {"dense": 3.0, "int8": 2.0, "w8a8": 1.0}
    monkeypatch.setattr(draft_int8, "best_of_sweeps", lambda keys, time, sweeps: {k: fastest[k[0]] for k in keys})
    summary = quantize_draft(_Draft(tied=False), rows=(1, 2))
    assert all(runs == [["w8a8", 1, 2]] for runs in summary.kernels_by_shape.values())
    assert set(summary.w8a8_error) == {"32x16", "16x32", "64x16"} and max(summary.w8a8_error.values()) <= 1
    # A kernel whose int16 pair sums saturate returns about half of each product
    # (`w8a8_reduce_range`'s probe: 16.2 of 32): auto falls back to int8 and says why.
    right = draft_int8.w8a8_linear
    monkeypatch.setattr(draft_int8, "w8a8_linear", lambda x, packed, bias: right(x, packed, bias) * 0.5)
    with caplog.at_level(logging.WARNING, logger=draft_int8.__name__):
        summary = quantize_draft(_Draft(tied=False), rows=(1, 2))
    assert all(runs == [["int8", 1, 2]] for runs in summary.kernels_by_shape.values())
    assert min(summary.w8a8_error.values()) > 1 and "no w8a8" in caplog.text
    assert summary.info()["w8a8_error"].keys() == summary.w8a8_error.keys()


def test_the_measured_plan_covers_every_count_up_to_the_largest_probed():
    plan = draft_int8.kernel_plan(torch.randn(64, 64, dtype=torch.bfloat16), rows=(1, 2, 4), sweeps=1)
    assert len(plan) == 4 and set(plan) <= {"dense", "int8", "w8a8"} and plan[2] == plan[3]


@pytest.mark.parametrize(
    "value, mode", [(None, "auto"), ("", "auto"), ("AUTO", "auto"), ("off", "off"), ("on", "on"), ("w8a8", "w8a8")]
)
def test_the_mode_switch(monkeypatch, value, mode):
    if value is None:
        monkeypatch.delenv(DRAFT_INT8_ENV, raising=False)
    else:
        monkeypatch.setenv(DRAFT_INT8_ENV, value)
    assert draft_int8_mode() == mode


def test_an_unknown_mode_names_the_variable_and_the_fix(monkeypatch):
    monkeypatch.setenv(DRAFT_INT8_ENV, "int4")
    with pytest.raises(ValueError, match=f"{DRAFT_INT8_ENV}='int4'.*'auto'.*'off'.*'on'.*'w8a8'"):
        draft_int8_mode()
