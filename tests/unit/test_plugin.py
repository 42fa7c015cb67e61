"""The plugin entry point: version gate, launch-line checks, host-change bookkeeping."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from sglang_specsot import plugin
from sglang_specsot.host.changes import HOST_CHANGES, HostChange, http_server_only, register_host_change


def test_entry_point_is_declared_for_sglang():
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    assert [ep.value for ep in eps if ep.name == "specsot"] == ["sglang_specsot.plugin:register"]


def test_version_gate_names_the_versions(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.22")
    with pytest.raises(RuntimeError, match=r"sglang==0\.5\.23.*found sglang==0\.5\.22"):
        plugin.check_sglang_version()


def test_version_gate_missing_sglang(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(RuntimeError, match="sglang is not installed"):
        plugin.check_sglang_version()


@pytest.mark.parametrize(
    ("argv", "cpu_engine", "cuda", "expect"),
    [
        (["--device", "cpu"], False, False, "SGLANG_USE_CPU_ENGINE=1"),
        (["--device=cpu"], False, True, "SGLANG_USE_CPU_ENGINE=1"),
        (["--device", "cpu"], True, False, None),
        ([], False, False, "needs a CUDA GPU"),
        (["--device", "cuda"], False, False, "needs a CUDA GPU"),
        (["--device", "cuda"], False, True, None),
        ([], False, True, None),
    ],
)
def test_device_mismatch_message(argv, cpu_engine, cuda, expect):
    message = plugin.device_mismatch_message(["--model-path", "m", *argv], cpu_engine, cuda)
    if expect is None:
        assert message is None
    else:
        assert expect in message


def test_host_change_names_and_targets_are_unique():
    names = [c.name for c in HOST_CHANGES]
    targets = [c.target for c in HOST_CHANGES]
    assert len(set(names)) == len(names) and len(set(targets)) == len(targets)
    with pytest.raises(ValueError, match="duplicates"):
        first = HOST_CHANGES[0]
        register_host_change(
            HostChange(first.name, "x.y", "after", lambda: None, "why", "p.diff")
        )


def test_every_host_change_has_a_patch_and_a_reason():
    root = os.path.join(os.path.dirname(__file__), "..", "..", "patches")
    for change in HOST_CHANGES:
        assert os.path.isfile(os.path.join(root, change.patch)), change
        assert len(change.why) > 40 and ".py:" in change.why, change


def test_register_in_a_sglang_cpu_process_applies_everything(tmp_path):
    """A fresh CPU-mode process: shim active, backend registered, host changes applied, twice."""
    trace = tmp_path / "trace.jsonl"
    code = (
        "from sglang.srt.plugins import load_plugins; load_plugins();"
        "from sglang_specsot.plugin import register; register();"
        "from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS;"
        "assert 'specsot_cpu' in ATTENTION_BACKENDS"
    )
    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", SGLANG_SPECSOT_TRACE_FILE=str(trace))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=600)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(records) == 2 and {r["error"] for r in records} == {None}
    # Every change whose process this is: all but the HTTP server's (no HTTP launcher here).
    expected = [c.name for c in HOST_CHANGES if c.when is not http_server_only]
    assert records[0]["host_changes"] == expected == records[1]["host_changes"]
    http_only = {c.name for c in HOST_CHANGES if c.when is http_server_only}
    assert http_only == {"sot-chat-route", "chat-body-is-an-object", "reject-unservable-requests"}


def test_the_processor_cache_is_bounded_and_still_deserializes():
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    from sglang_specsot.host.server_changes import PROCESSOR_CACHE_SIZE, _bounded_processor_cache_hook

    bounded = _bounded_processor_cache_hook()
    assert bounded.cache_info().maxsize == PROCESSOR_CACHE_SIZE
    assert bounded(DisallowedTokensLogitsProcessor.to_str()) is DisallowedTokensLogitsProcessor
    assert bounded.cache_info().currsize == 1


def test_the_eager_top_k_selection_is_sglangs_function_undecorated():
    import inspect

    import torch
    from sglang.srt.speculative import spec_utils

    from sglang_specsot.host.cpu_changes import _eager_select_top_k_hook

    eager = _eager_select_top_k_hook()
    compiled = spec_utils._select_top_k_tokens_later
    assert eager is not compiled and eager is inspect.unwrap(compiled)
    assert not hasattr(eager, "__wrapped__")  # nothing left for dynamo to compile
    # It runs as plain torch on a top-1 chain's step 2: the next inputs are the top tokens.
    g = torch.Generator().manual_seed(0)
    bs, topk = 3, 1
    topk_p = torch.rand(bs, topk, generator=g)
    topk_index = torch.randint(0, 100, (bs, topk), generator=g)
    input_ids, hidden, _, _ = eager(1, topk_p, topk_index, torch.rand(bs, 8, generator=g), torch.rand(bs, 1), topk)
    assert torch.equal(input_ids, topk_index.flatten()) and hidden.shape == (bs, 8)
