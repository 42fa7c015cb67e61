"""Unit tests route by the rules unless they say otherwise: the server's default router loads
all-MiniLM-L6-v2 (a download on a fresh machine, seconds of CPU) in a background thread,
which no unit test should set off by passing through the chat route. The integration tests
run the classifier on real servers (test_router_classifier.py, test_sot_server.py)."""

from __future__ import annotations

import pytest

from sglang_specsot.serving.router import ROUTER_ENV


@pytest.fixture(autouse=True)
def _route_by_the_rules(monkeypatch):
    monkeypatch.setenv(ROUTER_ENV, "rules")
