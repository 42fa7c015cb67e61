"""The wiring between the packages (sglang_specsot/wiring.py): what the SPECSOT workers take
from cpu/ (their DeviceSupport) is the CPU's, and is in place once SPECSOT is registered."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_specsot import wiring
from sglang_specsot.cpu import draft_int8
from sglang_specsot.cpu.threads import spin_report
from sglang_specsot.speculative import device


@pytest.fixture
def quantized(monkeypatch):
    """The calls the CPU's draft preparation makes to quantize_draft, which answers a summary."""
    calls = []

    def quantize(model, exclude, measured, forced):
        calls.append((model, exclude, measured, forced))
        return SimpleNamespace(info=lambda: {"layers": 1})

    monkeypatch.setattr(draft_int8, "quantize_draft", quantize)
    return calls


@pytest.mark.parametrize(("mode", "measured", "forced"), [("auto", True, "int8"), ("on", False, "int8")])
def test_on_cpu_the_draft_model_gets_int8_weights_as_the_mode_says(monkeypatch, quantized, mode, measured, forced):
    monkeypatch.setenv(draft_int8.DRAFT_INT8_ENV, mode)
    model, shared = object(), {1, 2}
    summary = wiring.DEVICE_SUPPORT.prepare_draft_model(model, shared, "cpu")
    assert summary.info() == {"layers": 1} and quantized == [(model, shared, measured, forced)]


@pytest.mark.parametrize(("mode", "on"), [("off", "cpu"), ("auto", "cuda"), ("on", "cuda:0")])
def test_off_or_on_another_device_the_draft_model_is_left_as_loaded(monkeypatch, quantized, mode, on):
    monkeypatch.setenv(draft_int8.DRAFT_INT8_ENV, mode)
    assert wiring.DEVICE_SUPPORT.prepare_draft_model(object(), set(), on) is None and quantized == []


def test_a_bad_mode_is_refused_on_every_device(monkeypatch, quantized):
    monkeypatch.setenv(draft_int8.DRAFT_INT8_ENV, "sometimes")
    with pytest.raises(ValueError, match="is not a mode"):
        wiring.DEVICE_SUPPORT.prepare_draft_model(object(), set(), "cuda")


def test_registering_specsot_provides_the_cpus_support(monkeypatch):
    monkeypatch.setattr(device, "_provided", device.NO_DEVICE_SUPPORT)
    assert device.provided().thread_report() is None  # nothing before registration
    wiring.register_specsot()
    assert device.provided() is wiring.DEVICE_SUPPORT and wiring.DEVICE_SUPPORT.thread_report is spin_report
