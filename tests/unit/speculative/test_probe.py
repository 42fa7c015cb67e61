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
    assert calls == [1, 8, 1, 8]  # the warm-up sweep and one timed sweep, once per row count


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
