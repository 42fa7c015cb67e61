"""The start-up probe: best of several sweeps over the row counts, so that a disturbance of a few
seconds spoils one sweep's time of a row count, not the cost model of the server's life."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang_specsot.costs import probe, published


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 16, bias=False)
        self.embed_tokens = torch.nn.Embedding(32, 8)  # not timed: an embedding is a lookup


def test_the_probe_keeps_each_row_counts_best_sweep(monkeypatch):
    # Scripted times: (warm-up sweep, then 3 sweeps) x rows (1, 8, 64); the first timed sweep
    # is disturbed at 8 rows, the second at 64, as a process starting beside the server would.
    scripted = iter([999.0, 999.0, 999.0,  10.0, 540.0, 60.0,  11.0, 20.0, 900.0,  10.5, 21.0, 61.0])
    seen_rows = []

    def fake_time(products, inputs, device):
        assert [k for k, _, _ in products] == [8]  # the projection, not the embedding
        seen_rows.append(inputs[(8, torch.float32)].shape[0])
        return next(scripted)

    monkeypatch.setattr(probe, "_time_products", fake_time)
    cost = probe.probe_forward_cost(_Tiny(), rows=(1, 8, 64), sweeps=3)
    assert seen_rows == [1, 8, 64] * 4  # sweeps over every row count, not repeats of one
    assert cost.probe_rows == (1, 8, 64) and cost.probe_ms == (10.0, 20.0, 60.0)


def test_a_larger_row_count_never_costs_less(monkeypatch):
    scripted = iter([1.0, 1.0, 5.0, 4.0, 5.0, 4.0])
    monkeypatch.setattr(probe, "_time_products", lambda products, inputs, device: next(scripted))
    cost = probe.probe_forward_cost(_Tiny(), rows=(1, 8), sweeps=2)
    assert cost.probe_ms == (5.0, 5.0)  # 8 rows measured 4 ms: raised to what 1 row cost


def test_the_real_products_are_timed():
    cost = probe.probe_forward_cost(_Tiny(), rows=(1, 4), sweeps=1)
    assert len(cost.probe_ms) == 2 and 0.0 < cost.probe_ms[0] <= cost.probe_ms[1]


def test_a_layer_with_an_int8_copy_is_timed_through_its_quant_method():
    calls = []

    class Method:
        def apply(self, layer, x, bias=None):
            calls.append(x.shape[0])
            return torch.nn.functional.linear(x, layer.weight)

    model = _Tiny()
    model.proj.quant_method, model.proj.specsot_int8_plan = Method(), ("int8",) * 4
    probe.probe_forward_cost(model, rows=(1, 8), sweeps=1)
    assert calls == [1, 8, 1, 8, 1, 8]  # a trial, the warm-up sweep and one timed sweep, once per row count


def _scheduler(model) -> SimpleNamespace:
    return SimpleNamespace(tp_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model)))


def test_every_server_probes_at_start_up_unless_its_worker_published_and_reports_the_curve(monkeypatch):
    monkeypatch.setattr(published, "_published", None)
    assert probe.probe_after_start_up("result", None, _scheduler(_Tiny()), False) == "result"
    cost = published.published()
    assert cost is not None and cost.probe_rows == probe.PROBE_ROWS
    probe.probe_after_start_up(None, None, _scheduler(None), False)  # a SPECSOT worker's curve stands
    assert published.published() is cost
    out = published.add_row_costs_after(SimpleNamespace(internal_state={}), None, None)
    assert out.internal_state[published.REPORT_KEY]["probe_rows"] == list(probe.PROBE_ROWS)


def test_a_model_the_probe_cannot_time_leaves_the_curve_unknown(monkeypatch, caplog):
    monkeypatch.setattr(published, "_published", None)
    probe.probe_after_start_up(None, None, _scheduler(torch.nn.LayerNorm(4)), False)  # no 2-D weight
    assert published.published() is None and "no row-cost curve" in caplog.text
    out = published.add_row_costs_after(SimpleNamespace(internal_state={"x": 1}), None, None)
    assert out.internal_state == {"x": 1, published.REPORT_KEY: None}


# -- quantized checkpoints: timed through their quant method, or left out with the reason -------


class _Fp8Method:
    """A quant method as SGLang's Fp8LinearMethod runs on a GPU: FP8 weights stored transposed
    ([in, out], fp8.py:1256) with a per-tensor scale, activations in the model's dtype."""

    def __init__(self):
        self.calls = []

    def apply(self, layer, x, bias=None):
        self.calls.append((x.shape[0], x.shape[1], x.dtype))
        return x @ (layer.weight.to(x.dtype) * layer.weight_scale.to(x.dtype))


class _QuantLinear(torch.nn.Module):
    """An SGLang-style linear layer of a quantized checkpoint: weights in `dtype`, a scale,
    its input width and activation dtype, and its quant method."""

    def __init__(self, in_features, out_features, dtype, method, transposed=False):
        super().__init__()
        shape = (in_features, out_features) if transposed else (out_features, in_features)
        self.weight = torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
        self.weight_scale = torch.nn.Parameter(torch.ones(out_features, 1), requires_grad=False)
        self.input_size, self.params_dtype, self.quant_method = in_features, torch.bfloat16, method


class _QuantizedModel(torch.nn.Module):
    def __init__(self, *layers):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(32, 16, dtype=torch.bfloat16)
        self.layers = torch.nn.ModuleList(layers)
        self.lm_head = torch.nn.Linear(16, 32, bias=False, dtype=torch.bfloat16)


def test_quantized_probe_times_fp8_layers_through_their_quant_method():
    method = _Fp8Method()
    fp8 = _QuantLinear(16, 24, torch.float8_e4m3fn, method, transposed=True)
    fp8.weight_scale = torch.nn.Parameter(torch.ones(()), requires_grad=False)
    cost = probe.probe_forward_cost(_QuantizedModel(fp8), rows=(1, 8), sweeps=1)
    assert cost.probe_rows == (1, 8) and len(cost.probe_ms) == 2
    # Input width 16 from the layer, not its transposed weight; activations in bfloat16, not FP8.
    assert {(k, dtype) for _, k, dtype in method.calls} == {(16, torch.bfloat16)}
    assert {n for n, _, _ in method.calls} == {1, 8}


def test_quantized_probe_times_int8_layers_through_their_quant_method():
    calls = []

    class Int8Method:  # as SGLang's W8A8Int8LinearMethod: int8 weights, a per-channel scale
        def apply(self, layer, x, bias=None):
            calls.append(x.shape)
            return torch.nn.functional.linear(x, layer.weight.to(x.dtype) * layer.weight_scale.to(x.dtype))

    int8 = _QuantLinear(16, 24, torch.int8, Int8Method())
    probe.probe_forward_cost(_QuantizedModel(int8), rows=(1, 8), sweeps=1)
    # Every product of the int8 layer is its quant method's (its [24, 1] scale is no matrix to time).
    assert calls and {tuple(shape) for shape in calls} == {(1, 16), (8, 16)}


def test_quantized_probe_leaves_out_what_it_cannot_run_with_the_reason_logged(caplog):
    class Broken:
        def apply(self, layer, x, bias=None):
            raise TypeError("no FP8 kernel for this device")

    raw = _QuantLinear(16, 24, torch.float8_e4m3fn, None)  # FP8 weights and no quant method
    broken = _QuantLinear(16, 24, torch.float8_e4m3fn, Broken())
    cost = probe.probe_forward_cost(_QuantizedModel(raw, broken), rows=(1, 8), sweeps=1)
    assert len(cost.probe_ms) == 2  # the LM head's curve
    assert "layers.0 (torch.float8_e4m3fn weights and no quant method to multiply them)" in caplog.text
    assert "layers.1 (TypeError: no FP8 kernel for this device)" in caplog.text


def test_quantized_probe_of_sglangs_own_fp8_and_int8_layers_completes(caplog):
    """SGLang's FP8 and W8A8-int8 linear layers, built as a checkpoint's loader builds them: each
    is timed through its quant method where its kernels run here, else left out with the reason
    (on a CPU without AMX or a GPU driver, SGLang's kernels for both are missing)."""
    from sglang.srt.layers.linear import ReplicatedLinear
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.layers.quantization.w8a8_int8 import W8A8Int8Config

    configs = [Fp8Config(is_checkpoint_fp8_serialized=True), W8A8Int8Config(quant_config={})]
    layers = [ReplicatedLinear(16, 24, bias=False, quant_config=c, params_dtype=torch.bfloat16) for c in configs]
    assert [layer.weight.dtype for layer in layers] == [torch.float8_e4m3fn, torch.int8]
    inputs, errors = [set() for _ in layers], [None for _ in layers]
    for i, layer in enumerate(layers):
        layer.quant_method.apply = _spy(layer.quant_method.apply, inputs[i], errors, i)
    cost = probe.probe_forward_cost(_QuantizedModel(*layers), rows=(1, 8), sweeps=1)
    assert len(cost.probe_ms) == 2
    assert inputs == [{(16, torch.bfloat16)}] * 2  # through the quant method: never F.linear on FP8
    for i, error in enumerate(errors):  # named in the warning exactly when left out, with its error
        assert (f"layers.{i}" in caplog.text) == (error is not None), caplog.text
        assert error is None or f"{type(error).__name__}: {error}" in caplog.text


def _spy(apply, inputs: set, errors: list, i: int):
    def run(layer, x, bias=None):
        inputs.add((x.shape[1], x.dtype))
        try:
            return apply(layer, x, bias)
        except Exception as exc:
            errors[i] = exc
            raise

    return run


def test_quantized_probe_never_stops_start_up(monkeypatch, caplog):
    monkeypatch.setattr(published, "_published", None)
    only_fp8 = torch.nn.Module()
    only_fp8.proj = _QuantLinear(16, 24, torch.float8_e4m3fn, None)
    assert probe.probe_after_start_up("result", None, _scheduler(only_fp8), False) == "result"
    assert published.published() is None and "no row-cost curve" in caplog.text


def test_quantized_probe_with_nothing_to_time_leaves_the_worker_a_placeholder(caplog):
    # A model none of whose layers the probe can time (no dense weight, no quant method):
    # the worker's probe gives no curve, says why, and the server drafts its whole window.
    model = torch.nn.Sequential(torch.nn.LayerNorm(4))  # a 1-D weight only
    with caplog.at_level("WARNING"):
        assert probe.probe_or_none(model, "target") is None
    assert "no start-up cost curve for the target" in caplog.text and "whole window" in caplog.text
    first, second = probe.unmeasured(), probe.unmeasured()
    assert first is not second and first.ms(1) > 0  # each model its own, never a zero-cost step
