"""SGLang's model gateway (`smg`, from requirements/dev.lock) in front of workers, for the tests."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sglang_specsot.launch import free_port


def http(url: str, payload: dict | None = None, timeout: float = 10.0):
    """GET (or POST `payload` to) `url`; the JSON answer."""
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def wait_until_answers(url: str, what: str, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            http(url, timeout=2.0)
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{what} did not answer {url} within {deadline_s:.0f} s")


def gateway_binary() -> str:
    found = shutil.which("smg", path=str(Path(sys.executable).parent)) or shutil.which("smg")
    if found is None:
        pytest.fail("the `smg` gateway is not installed: scripts/setup.sh installs it from requirements/dev.lock")
    return found


@contextmanager
def gateway(workers: list[str], log: Path, policy: str = "round_robin") -> Iterator[str]:
    """The gateway's URL, routing over `workers` by `policy`, until the block ends."""
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [gateway_binary(), "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
             "--worker-urls", *workers],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until_answers(f"http://127.0.0.1:{port}/readiness", f"the gateway (log: {log})")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()  # only the process this block started
        proc.wait(timeout=10)
