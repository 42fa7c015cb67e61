"""oneDNN's packed weight layout on CPU: the same products as the loaded layout through SGLang's
own linear method, the choice from timings, the mode switch, where it refuses, and what else
reads a packed layer (the row-cost probe, the draft model's int8 copies, storage keys)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

from sglang_specsot.costs.probe import probe_forward_cost, storage_key
from sglang_specsot.cpu import draft_int8, packed_linear
from sglang_specsot.cpu.packed_linear import (
    PACKED_LINEAR_ENV, choose_packed, is_packed, linear, maybe_pack, pack_after_loading, packed_mode, strided,
)  # fmt: skip

# bf16 is what the runtime packs; where oneDNN has no bf16 kernel (an AVX2-only CPU) the same
# mechanism is tested in float32, which oneDNN packs everywhere (its products then agree within
# float32's rounding, not bit for bit).
DTYPE = torch.bfloat16 if packed_linear.available(torch.bfloat16) else torch.float32


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    exact = DTYPE == torch.bfloat16
    torch.testing.assert_close(a, b, **({"rtol": 0, "atol": 0} if exact else {}))


@pytest.fixture(autouse=True)
def _packs_the_test_dtype(monkeypatch):
    monkeypatch.setattr(packed_linear, "PACKED_DTYPES", (DTYPE,))


class _Linear(torch.nn.Module):
    """An SGLang linear layer's shape: a weight with SGLang's attributes, and its quant method."""

    def __init__(self, n: int, k: int, bias: bool = False, dtype=DTYPE):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, k, dtype=dtype) * 0.1, requires_grad=False)
        self.weight.input_dim, self.weight.output_dim = 1, 0
        self.bias = torch.nn.Parameter(torch.randn(n, dtype=dtype), requires_grad=False) if bias else None
        self.quant_method = UnquantizedLinearMethod()

    def forward(self, x):
        return self.quant_method.apply(self, x, self.bias)


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = _Linear(48, 32, bias=True)
        self.down = _Linear(32, 48)

    def forward(self, x):
        return self.down(self.up(x))


@pytest.mark.parametrize("shape", [(5, 32), (2, 3, 32), (1, 32)])
def test_a_packed_layer_gives_the_products_of_its_loaded_weight(shape):
    layer = _Linear(48, 32, bias=True)
    x = torch.randn(*shape, dtype=DTYPE)
    expected = layer(x)
    assert maybe_pack(layer, "on")
    assert is_packed(layer.weight) and type(layer.quant_method).__name__ == "PackedUnquantizedLinearMethod"
    assert isinstance(layer.quant_method, UnquantizedLinearMethod)  # SGLang's type checks still hold
    same(layer(x), expected)
    assert (layer.weight.input_dim, layer.weight.output_dim) == (1, 0)  # SGLang's attributes kept


def test_apply_into_writes_the_packed_product_into_the_callers_output():
    layer = _Linear(48, 32)
    x = torch.randn(4, 32, dtype=DTYPE)
    expected = layer(x)
    maybe_pack(layer, "on")
    out = torch.empty(4, 48, dtype=DTYPE)
    assert layer.quant_method.apply_into(layer, x, out) is out
    same(out, expected)


def test_the_hook_packs_only_where_measured_faster(monkeypatch):
    calls = []

    def faster(n, k, dtype):
        calls.append((n, k))
        return n == 48

    monkeypatch.setattr(packed_linear, "packs_faster", faster)
    monkeypatch.delenv(PACKED_LINEAR_ENV, raising=False)
    model = _Model()
    for layer in (model.up, model.down):
        pack_after_loading(None, layer.quant_method, layer)
    assert is_packed(model.up.weight) and not is_packed(model.down.weight)
    assert calls == [(48, 32), (32, 48)]


def test_off_and_other_dtypes_keep_the_loaded_layout(monkeypatch):
    monkeypatch.setattr(packed_linear, "packs_faster", lambda *a: True)
    assert not maybe_pack(_Linear(48, 32), "off")
    monkeypatch.setattr(packed_linear, "PACKED_DTYPES", (torch.bfloat16,))  # the runtime's own
    assert not maybe_pack(_Linear(48, 32, dtype=torch.float32), "on")  # float32 parity runs keep torch's path


def test_the_mode_is_checked(monkeypatch):
    monkeypatch.setenv(PACKED_LINEAR_ENV, "fast")
    with pytest.raises(ValueError, match="SGLANG_SPECSOT_PACKED_LINEAR='fast'.*auto, off, on"):
        packed_mode()
    monkeypatch.setenv(PACKED_LINEAR_ENV, " OFF ")
    assert packed_mode() == "off"


def test_packed_is_chosen_only_where_no_row_count_is_slower():
    assert choose_packed({1: (1.4, 0.75), 16: (1.7, 1.1), 256: (9.0, 8.0)})
    assert not choose_packed({1: (1.4, 0.75), 16: (1.7, 1.1), 256: (9.0, 9.5)})  # prefill slower
    assert not choose_packed({1: (1.0, 1.0), 16: (1.0, 1.0)})  # equal: keep SGLang's path


def test_where_onednn_cannot_pack_bf16_nothing_is_packed_and_the_server_is_not_stopped():
    # oneDNN capped at AVX2, as on the AVX2-only EPYC: its bf16 reorder raises there.
    code = (
        "import torch\nfrom sglang_specsot.cpu import packed_linear as pl\n"
        "from tests.unit.cpu.test_packed_linear import _Linear\n"
        "layer = _Linear(48, 32, dtype=torch.bfloat16)\n"
        "print(pl.available(), pl.maybe_pack(layer, 'on'), pl.is_packed(layer.weight))\n"
    )
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


def test_the_row_cost_probe_times_a_packed_layer_through_its_method():
    model = _Model()
    for layer in (model.up, model.down):
        maybe_pack(layer, "on")
    cost = probe_forward_cost(model, rows=(1, 4), sweeps=1)
    assert len(cost.probe_ms) == 2 and all(ms > 0 for ms in cost.probe_ms)


def test_a_packed_draft_layer_gets_int8_copies_of_its_loaded_weight_and_keeps_its_products():
    layer = _Linear(48, 32)
    loaded = layer.weight.detach().clone()
    x = torch.randn(2, 32, dtype=DTYPE)
    expected = layer(x)
    maybe_pack(layer, "on")
    assert torch.equal(strided(layer.weight), loaded)
    assert draft_int8.dense_layers(layer) == [layer]
    assert draft_int8.dense_layers(layer, exclude={storage_key(layer.weight)}) == []
    summary = draft_int8.quantize_draft(layer, measured=False, forced=draft_int8.INT8)
    assert summary.layers == 1
    q, s = draft_int8.quantize_rows(loaded)
    assert torch.equal(layer.specsot_int8, q) and torch.equal(layer.specsot_int8_scales, s)
    wide = torch.randn(draft_int8.INT8_FORCED_ROWS + 1, 32, dtype=DTYPE)
    same(layer(wide), linear(wide, loaded))  # dense rows: the packed product
    assert layer(x).shape == expected.shape


def test_storage_keys_tell_weights_apart_in_either_layout():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    assert storage_key(a) == a.data_ptr() and storage_key(a) != storage_key(b)
    p = packed_linear.pack(torch.randn(8, 16, dtype=DTYPE))
    assert storage_key(p) == id(p)
