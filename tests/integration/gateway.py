"""SGLang's model gateway for the tests: the library's launcher (sglang_specsot/gateway.py),
failing the test with the fix when `smg` is not installed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sglang_specsot import gateway as _gateway
from sglang_specsot.gateway import http, wait_until_answers

__all__ = ["gateway", "http", "wait_until_answers"]


@contextmanager
def gateway(workers: list[str], log: Path, policy: str = "round_robin") -> Iterator[str]:
    try:
        _gateway.gateway_binary()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    with _gateway.gateway(workers, log, policy) as url:
        yield url
