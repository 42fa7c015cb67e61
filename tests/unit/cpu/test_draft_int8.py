"""Int8 draft weights on CPU: exact per-row quantization, both int8 kernels, the plan of kernels
by row count and its dispatch, which layers are given a copy, and the mode switch."""

from __future__ import annotations

import pytest
import torch
from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod, UnquantizedLinearMethod

from sglang_specsot.cpu import draft_int8
from sglang_specsot.cpu.draft_int8 import (
    DRAFT_INT8_ENV, dense_layers, draft_int8_mode, int8_linear, pack_w8a8, plan_from_times, plan_ranges,
    quantize_draft, quantize_rows, w8a8_available, w8a8_linear,
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
def test_the_w8a8_product_is_close_to_the_product_with_the_dequantized_weights():
    w, b = torch.randn(24, 32, dtype=torch.bfloat16), torch.randn(24, dtype=torch.bfloat16)
    q, s = quantize_rows(w)
    x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    expected = x.float() @ (q.float() * s.float()[:, None]).T + b.float()
    out = w8a8_linear(x, pack_w8a8(w), b)
    assert out.shape == (2, 3, 24) and out.dtype == torch.bfloat16
    # The activations go through 8 bits too: within ~1% of the product's scale.
    assert float((out.float() - expected).norm() / expected.norm()) < 0.03


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
    return lambda weight, rows, sweeps: tuple(kernels)


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
        draft_int8, "kernel_plan", lambda weight, rows, sweeps: ("dense",) if weight.shape[0] == 16 else ("int8",)
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
