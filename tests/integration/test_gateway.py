"""SGLang's model gateway (`smg`, the real binary from PyPI) in front of two fake workers: which
of SoT's fields reach the worker that answers.

Server-side SoT is asked for by the chat request's top-level `specsot` field, and the frontend
program's branches carry their SoT tag in `/generate`'s `sampling_params.custom_params`; a
gateway that re-serialises a typed request could drop either without an error. The fake
workers (tests/integration/fake_worker.py) record every request they get.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sglang_specsot.launch import free_port
from tests.integration.gateway import gateway, http, wait_until_answers

pytestmark = pytest.mark.integration

FAKE_WORKER = Path(__file__).with_name("fake_worker.py")
SOT = {"mode": "on", "max_points": 4}
TAG = {"specsot": {"group": "g1", "role": "branch", "point": 0, "n": 2}}


@pytest.fixture(scope="module")
def gateway_over_fakes(tmp_path_factory):
    """(gateway URL, [worker URLs]) with the gateway routing round-robin over two fake workers."""
    workers, procs = [], []
    try:
        for _ in range(2):
            port = free_port()
            procs.append(subprocess.Popen([sys.executable, str(FAKE_WORKER), str(port)]))
            workers.append(f"http://127.0.0.1:{port}")
        for url in workers:
            wait_until_answers(f"{url}/health", "a fake worker")
        with gateway(workers, tmp_path_factory.mktemp("gateway") / "smg.log") as url:
            yield url, workers
    finally:
        for proc in procs:  # only the processes this fixture started
            proc.terminate()
            proc.wait(timeout=10)


def _arrived(workers: list[str], path: str) -> list[dict]:
    seen = [r for url in workers for r in http(f"{url}/_seen")]
    return [r for r in seen if r["method"] == "POST" and r["path"] == path]


def test_gateway_passes_the_specsot_field_of_a_chat_request(gateway_over_fakes):
    url, workers = gateway_over_fakes
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "Name three rivers."}], "specsot": SOT}
    answer = http(f"{url}/v1/chat/completions", body)
    assert answer["choices"][0]["message"]["content"] == "ok"
    (arrived,) = _arrived(workers, "/v1/chat/completions")
    assert arrived["body"].get("specsot") == SOT, f"the gateway dropped or changed the specsot field: {arrived['body']}"


def test_gateway_passes_the_branch_tag_of_a_generate_request(gateway_over_fakes):
    url, workers = gateway_over_fakes
    body = {"text": "Point 1:", "sampling_params": {"max_new_tokens": 8, "temperature": 0, "custom_params": TAG}}
    http(f"{url}/generate", body)
    (arrived,) = _arrived(workers, "/generate")
    got = arrived["body"].get("sampling_params", {}).get("custom_params")
    assert got == TAG, f"the gateway dropped or changed sampling_params.custom_params: {arrived['body']}"
