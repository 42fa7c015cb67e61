"""The bounded load test (`python -m sglang_specsot.loadtest`) for one minute against a SPECSOT
SmolLM2-135M server: 32 clients, plain and SoT, streaming and not, 10% cut at random. Nothing
fails or is lost, the server is idle and healthy afterwards, and the teardown proves SGLang's
strict idle memory check ran and found no leaked KV slot or request row."""

from __future__ import annotations

import json

import pytest

from sglang_specsot.loadtest import SERVER_ARGS, main
from tests.integration.conftest import leak_checked_server

pytestmark = [pytest.mark.integration, pytest.mark.long]


def test_one_minute_of_load_loses_nothing(smollm2_path, tmp_path):
    out = tmp_path / "load.json"
    with leak_checked_server(smollm2_path, SERVER_ARGS, tmp_path / "server.log") as server:
        status = main(["--url", server.base_url, "--duration", "60", "--clients", "32", "--out", str(out)])
    report = json.loads(out.read_text())
    assert status == 0 and report["ok"], report
    assert report["failed"] == report["lost"] == 0, report["failures"]
    assert report["completed"] > 0 and report["latency"]["plain"] and report["latency"]["sot"], report
    assert report["after"]["num_used_tokens"] == 0, report["after"]  # every KV slot came back
    # Where the scheduler's memory went, before, during and after (/server_info's specsot.memory).
    first, last = report["memory_timeline"][0], report["memory_timeline"][-1]
    for entry in (first, last):
        assert entry["malloc"]["in_use_mb"] > 0 and entry["python_blocks"] > 0, entry
    assert last["t_s"] > first["t_s"] and last["drafter"]["corpus_tokens"] > 0, (first, last)
    # The HTTP server's process, where server-side SoT runs, is measured beside the scheduler.
    assert first["http_rss_mb"] > 0 and report["after"]["http_rss_mb"] > 0, (first, report["after"])
