"""How a verify runs: tier graphs installed per step, a capture failure stopping the start-up,
and the dummy verify input SPECSOT's target graphs are captured with (the capture's through
adapter.verify_graph_runner_cls; SGLang's warm-up's through host change
specsot-dummy-verify-input)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_specsot.speculative import verify_runners
from sglang_specsot.speculative.algorithm import SpecSoTAlgo
from sglang_specsot.speculative.inputs import SoTVerifyInput
from sglang_specsot.speculative.policy.tiers import VerifyTiers
from sglang_specsot.speculative.verify_input import dummy_verify_input_around


class FakeTarget:
    """A target worker whose forward records which graph runner the model runner held."""

    def __init__(self, model_runner, replays: bool = True):
        self.model_runner, self.replays, self.seen = model_runner, replays, []

    def forward_batch_generation(self, batch, pp_proxy_tensors=None, is_verify=False):
        assert is_verify
        self.seen.append((self.model_runner.attn_backend, self.model_runner.decode_cuda_graph_runner))
        return SimpleNamespace(can_run_cuda_graph=self.replays)


def _fake_capture(calls):
    def capture(model_runner, width, dummy_input):
        calls.append(width)
        assert dummy_input(torch.zeros(4, dtype=torch.bool), width).draft_token_num == width
        return f"backend-{width}", SimpleNamespace(width=width, capture_bs=[1, 2, 4])

    return capture


def _model_runner(**fields):
    return SimpleNamespace(spec_algorithm=SimpleNamespace(is_eagle=lambda: False), **fields)


def test_tier_graphs_install_each_steps_tier_and_count_replays(monkeypatch):
    calls = []
    monkeypatch.setattr(verify_runners.sgl, "capture_verify_graphs", _fake_capture(calls), raising=False)
    runner = _model_runner(attn_backend="init", decode_cuda_graph_runner=None)
    verify = verify_runners.verify_runner(runner, VerifyTiers.powers(8))
    assert calls == [8, 4, 2, 1]  # widest first: the smaller captures reuse its memory pool
    target = FakeTarget(runner)
    for width in (1, 4, 8, 4):
        verify.forward(target, batch=None, width=width)
    assert [b for b, _ in target.seen] == ["backend-1", "backend-4", "backend-8", "backend-4"]
    assert [r.width for _, r in target.seen] == [1, 4, 8, 4]
    assert verify.info()["replayed_by_width"] == {"1": 1, "4": 2, "8": 1}
    with pytest.raises(AssertionError, match="not a captured tier"):
        verify.forward(target, batch=None, width=3)


def test_tier_step_sglang_runs_eagerly_is_counted_eager(monkeypatch):
    monkeypatch.setattr(verify_runners.sgl, "capture_verify_graphs", _fake_capture([]), raising=False)
    runner = _model_runner(attn_backend="init", decode_cuda_graph_runner=None)
    verify = verify_runners.verify_runner(runner, VerifyTiers.powers(4))
    verify.forward(FakeTarget(runner, replays=False), batch=None, width=2)
    assert verify.info()["eager_by_width"] == {"2": 1} and verify.info()["replayed_by_width"] == {}


def test_tier_capture_that_fails_stops_the_start_up_naming_the_flag(monkeypatch):
    def fail(model_runner, width, dummy_input):
        raise RuntimeError("out of graph memory")

    monkeypatch.setattr(verify_runners.sgl, "capture_verify_graphs", fail, raising=False)
    with pytest.raises(RuntimeError) as err:
        verify_runners.verify_runner(_model_runner(), VerifyTiers.powers(8))
    assert "out of graph memory" in str(err.value) and "--disable-cuda-graph" in str(err.value)


def test_tier_dummy_verify_input_is_specsots_at_the_tiers_width():
    mask = torch.zeros(64, dtype=torch.bool)
    original = lambda *args: ("sglang", args)  # noqa: E731
    algo = SpecSoTAlgo("SPECSOT", lambda sa: None)
    dummy = dummy_verify_input_around(original, algo, mask, 4, False)
    assert isinstance(dummy, SoTVerifyInput)
    assert dummy.custom_mask is mask and dummy.num_tokens_per_req == dummy.draft_token_num == 4
    # A draft worker's runner, and every other algorithm, get SGLang's own.
    assert dummy_verify_input_around(original, algo, mask, 4, True)[0] == "sglang"
    other = SimpleNamespace(name="EAGLE")
    assert dummy_verify_input_around(original, other, mask, 4, False) == ("sglang", (other, mask, 4, False))


def test_draft_capture_that_fails_stops_the_start_up_naming_the_flag(monkeypatch):
    """With a draft model the worker captures the verify tiers, then the draft's own graphs
    (SGLang's STANDALONE capture); that capture failing is a start-up error, as the verify
    tiers' is, not a draft that silently runs eagerly."""
    import contextlib

    from sglang_specsot.speculative import worker as worker_module

    def fail(self):
        raise RuntimeError("draft capture out of memory")

    sgl = worker_module.sgl
    monkeypatch.setattr(sgl, "verify_graphs_wanted", lambda: True, raising=False)
    monkeypatch.setattr(sgl, "decode_graphs_on", lambda *a, **k: contextlib.nullcontext(), raising=False)
    monkeypatch.setattr(sgl, "get_spec", lambda: SimpleNamespace(speculative_num_steps=3), raising=False)
    monkeypatch.setattr(worker_module, "verify_runner", lambda runner, tiers: SimpleNamespace(tiers=tiers))
    monkeypatch.setattr(sgl.SpecWorkerBase, "init_cuda_graphs", fail, raising=False)
    worker = object.__new__(worker_module.SpecSoTWorker)
    worker.device_type, worker.verifier, worker.num_draft_tokens = "cuda", None, 6
    worker._draft_worker, worker.model_runner, worker.planners = object(), None, {}  # BaseSpecWorker.draft_worker reads it
    with pytest.raises(RuntimeError) as err:
        worker.init_cuda_graphs()
    message = str(err.value)
    assert "draft model's graphs failed" in message and "draft capture out of memory" in message
    assert "--disable-cuda-graph" in message
