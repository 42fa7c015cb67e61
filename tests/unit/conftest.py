"""Unit tests route by the rules unless they say otherwise: the server's default router loads
all-MiniLM-L6-v2 (a download on a fresh machine, seconds of CPU) in a background thread,
which no unit test should set off by passing through the chat route. The integration tests
run the classifier on real servers (test_router_classifier.py, test_sot_server.py). Checks
that need SGLang in a CPU-engine process of its own share one (`cpu_process`)."""

from __future__ import annotations

import pytest

from sglang_specsot.serving.router_choice import ROUTER_ENV
from tests.unit import cpu_checks


@pytest.fixture(autouse=True)
def _route_by_the_rules(monkeypatch):
    monkeypatch.setenv(ROUTER_ENV, "rules")


@pytest.fixture(scope="session")
def cpu_process(tiny_model_path, tmp_path_factory):
    """A check's `result` from the one SGLang CPU-engine interpreter the unit tests share
    (tests/unit/cpu_checks.py), run at the first ask; a check that raised fails its test."""
    outcomes = cpu_checks.run(tiny_model_path, tmp_path_factory.mktemp("cpu-process"))

    def result(name: str):
        assert name in outcomes, f"no check named {name!r} ran in the shared CPU-engine process"
        assert "error" not in outcomes[name], outcomes[name]["error"]
        return outcomes[name]["result"]

    return result
