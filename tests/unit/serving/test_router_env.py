"""Which router server-side SoT uses: SGLANG_SPECSOT_ROUTER, the classifier attached in mode
"auto" only, and the rules alone (with one warning) when the classifier cannot load."""

from __future__ import annotations

import logging

import pytest

from sglang_specsot.models.fetcher import FetchError
from sglang_specsot.serving import router_choice as server
from sglang_specsot.sot.router_head import Suitability
from sglang_specsot.sot.runner import SoTOptions


def classifier(question: str) -> Suitability:
    return Suitability(0.9, 0.5)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(server, "_loaded", {})
    monkeypatch.delenv(server.ROUTER_ENV, raising=False)


def test_the_classifier_is_the_default_and_rules_can_be_chosen(monkeypatch):
    assert server.server_router() == "classifier"
    monkeypatch.setenv(server.ROUTER_ENV, " Rules ")
    assert server.server_router() == "rules"


def test_an_unknown_router_is_named_with_the_choices(monkeypatch):
    monkeypatch.setenv(server.ROUTER_ENV, "model")
    with pytest.raises(ValueError, match="SGLANG_SPECSOT_ROUTER='model' is not one of 'classifier', 'rules'"):
        server.server_router()


def test_mode_auto_gets_the_classifier_once_loaded(monkeypatch):
    loads = []
    monkeypatch.setattr(server, "_load", lambda: loads.append(1) or classifier)
    assert server.with_server_classifier(SoTOptions(mode="auto")).classifier is classifier
    assert server.with_server_classifier(SoTOptions(mode="auto")).classifier is classifier
    assert loads == [1]


@pytest.mark.parametrize("options", [SoTOptions(mode="on"), SoTOptions(mode="off"),
                                     SoTOptions(mode="auto", classifier=len)])  # fmt: skip
def test_other_modes_and_a_set_classifier_are_left_alone(monkeypatch, options):
    monkeypatch.setattr(server, "_load", lambda: classifier)
    assert server.with_server_classifier(options) is options


def test_rules_alone_never_load_the_classifier(monkeypatch):
    monkeypatch.setenv(server.ROUTER_ENV, "rules")
    monkeypatch.setattr(server, "_load", lambda: pytest.fail("loaded"))
    options = SoTOptions(mode="auto")
    assert server.with_server_classifier(options) is options
    server.warm_up()  # starts no thread that would load it


def test_a_classifier_that_cannot_load_leaves_the_rules_with_one_warning(monkeypatch, caplog):
    import sglang_specsot.models.router_classifier as rc

    def unreachable():
        raise FetchError("pypi.org is unreachable")

    monkeypatch.setattr(rc, "load_default_classifier", unreachable)
    with caplog.at_level(logging.WARNING, logger=server.__name__):
        for _ in range(3):
            assert server.with_server_classifier(SoTOptions(mode="auto")).classifier is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "pypi.org is unreachable" in warnings[0].getMessage()
    assert "SGLANG_SPECSOT_ROUTER=rules" in warnings[0].getMessage()


def test_mode_auto_gets_the_configured_quality_gate_and_other_modes_do_not(monkeypatch, tmp_path):
    from sglang_specsot.sot import quality_gate
    from sglang_specsot.sot.router_head import LinearHead

    head = tmp_path / "head.json"
    head.write_text(LinearHead((0.0,) * 5, 0.0, 0.5, quality_gate.SKELETON_FEATURES).to_json())
    monkeypatch.setenv(server.ROUTER_ENV, "rules")
    monkeypatch.setenv(quality_gate.QUALITY_HEAD_ENV, str(head))
    quality_gate.configured_quality_gate.cache_clear()
    try:
        assert server.with_server_classifier(SoTOptions(mode="auto")).quality_gate.head.weights == (0.0,) * 5
        for mode in ("on", "off"):
            options = SoTOptions(mode=mode)
            assert server.with_server_classifier(options) is options
    finally:
        quality_gate.configured_quality_gate.cache_clear()


def test_a_question_quality_head_under_the_rules_router_is_warned_about(monkeypatch, tmp_path, caplog):
    from sglang_specsot.sot import quality_gate
    from sglang_specsot.sot.router_head import LinearHead

    head = tmp_path / "head.json"
    head.write_text(LinearHead((0.0,) * 384, 0.0, 0.5, "all-MiniLM-L6-v2").to_json())
    monkeypatch.setenv(server.ROUTER_ENV, "rules")
    monkeypatch.setenv(quality_gate.QUALITY_HEAD_ENV, str(head))
    quality_gate.configured_quality_gate.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=server.__name__):
            server.warm_up()
    finally:
        quality_gate.configured_quality_gate.cache_clear()
    messages = [r.getMessage() for r in caplog.records]
    assert any("quality head reads the question" in m for m in messages)
    assert any("SGLANG_SPECSOT_ROUTER=rules computes none: it will veto nothing" in m for m in messages)
