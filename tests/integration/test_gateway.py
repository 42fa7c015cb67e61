"""SGLang's model gateway (`smg`, the real binary from PyPI) in front of two fake workers: which
of SoT's fields reach the worker that answers.

Server-side SoT is asked for by the chat request's top-level `specsot` field, and the frontend
program's branches carry their SoT tag in `/generate`'s `sampling_params.custom_params`; a
gateway that re-serialises a typed request could drop either without an error. The fake
workers (tests/integration/fake_worker.py) record every request they get.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sglang_specsot.launch import free_port

pytestmark = pytest.mark.integration

FAKE_WORKER = Path(__file__).with_name("fake_worker.py")
SOT = {"mode": "on", "max_points": 4}
TAG = {"specsot": {"group": "g1", "role": "branch", "point": 0, "n": 2}}


def _http(url: str, payload: dict | None = None, timeout: float = 10.0):
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def _wait(url: str, what: str, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            _http(url, timeout=2.0)
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{what} did not answer {url} within {deadline_s:.0f} s")


def _gateway_binary() -> str:
    found = shutil.which("smg", path=str(Path(sys.executable).parent)) or shutil.which("smg")
    if found is None:
        pytest.fail("the `smg` gateway is not installed: scripts/setup.sh installs it from requirements/dev.lock")
    return found


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """(gateway URL, [worker URLs]) with the gateway routing round-robin over two fake workers."""
    procs, log = [], tmp_path_factory.mktemp("gateway") / "smg.log"
    try:
        workers = []
        for _ in range(2):
            port = free_port()
            procs.append(subprocess.Popen([sys.executable, str(FAKE_WORKER), str(port)]))
            workers.append(f"http://127.0.0.1:{port}")
        for url in workers:
            _wait(f"{url}/health", "a fake worker")
        port = free_port()
        with open(log, "w") as out:
            procs.append(subprocess.Popen(
                [_gateway_binary(), "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
                 "--worker-urls", *workers],
                stdout=out, stderr=subprocess.STDOUT,
            ))  # fmt: skip
        _wait(f"http://127.0.0.1:{port}/readiness", f"the gateway (log: {log})")
        yield f"http://127.0.0.1:{port}", workers
    finally:
        for proc in procs:  # only the processes this fixture started
            proc.terminate()
            proc.wait(timeout=10)


def _arrived(workers: list[str], path: str) -> list[dict]:
    seen = [r for url in workers for r in _http(f"{url}/_seen")]
    return [r for r in seen if r["method"] == "POST" and r["path"] == path]


def test_gateway_passes_the_specsot_field_of_a_chat_request(gateway):
    url, workers = gateway
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "Name three rivers."}], "specsot": SOT}
    answer = _http(f"{url}/v1/chat/completions", body)
    assert answer["choices"][0]["message"]["content"] == "ok"
    (arrived,) = _arrived(workers, "/v1/chat/completions")
    assert arrived["body"].get("specsot") == SOT, f"the gateway dropped or changed the specsot field: {arrived['body']}"


def test_gateway_passes_the_branch_tag_of_a_generate_request(gateway):
    url, workers = gateway
    body = {"text": "Point 1:", "sampling_params": {"max_new_tokens": 8, "temperature": 0, "custom_params": TAG}}
    _http(f"{url}/generate", body)
    (arrived,) = _arrived(workers, "/generate")
    got = arrived["body"].get("sampling_params", {}).get("custom_params")
    assert got == TAG, f"the gateway dropped or changed sampling_params.custom_params: {arrived['body']}"
