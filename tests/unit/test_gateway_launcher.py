"""The gateway launcher's core split (sglang_specsot/gateway.py)."""

from __future__ import annotations

import pytest

from sglang_specsot.gateway import core_sets


@pytest.mark.parametrize("replicas, cores, sets", [
    (1, 2, ["0-1"]), (2, 2, ["0", "1"]), (2, 8, ["0-3", "4-7"]), (3, 8, ["0-2", "3-5", "6-7"]),
])  # fmt: skip
def test_each_replica_gets_its_own_contiguous_cores(replicas, cores, sets):
    assert core_sets(replicas, cores) == sets


@pytest.mark.parametrize("replicas", [0, 3])
def test_more_replicas_than_cores_is_refused_with_the_range(replicas):
    with pytest.raises(ValueError, match=rf"replicas={replicas}: .* has 2; use 1 to 2 replicas"):
        core_sets(replicas, 2)


def test_replicas_run_on_their_own_cores_behind_the_gateway(tmp_path, monkeypatch):
    from contextlib import contextmanager

    from sglang_specsot import gateway

    started, routed = [], []

    class FakeServer:
        def __init__(self, target, args, env, log_path):
            self.base_url = f"http://127.0.0.1:{31000 + len(started)}"
            started.append((env, log_path))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    @contextmanager
    def fake_gateway(workers, log, policy):
        routed.append((workers, log, policy))
        yield "http://127.0.0.1:30000"

    monkeypatch.setattr("sglang_specsot.launch.ServerProcess", FakeServer)
    monkeypatch.setattr(gateway, "gateway", fake_gateway)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    with gateway.served("/m", [], {"A": "1"}, 2, "round_robin", tmp_path, "SoT") as (url, processes):
        assert url == "http://127.0.0.1:30000"  # clients send to the gateway
        urls = [p.base_url for p in processes]
        assert urls == ["http://127.0.0.1:31000", "http://127.0.0.1:31001"]
    assert started == [({"A": "1", "SGLANG_CPU_OMP_THREADS_BIND": "0"}, tmp_path / "SoT-0.log"),
                       ({"A": "1", "SGLANG_CPU_OMP_THREADS_BIND": "1"}, tmp_path / "SoT-1.log")]  # fmt: skip
    assert routed == [(urls, tmp_path / "smg-SoT.log", "round_robin")]


def test_one_replica_is_served_directly_without_a_gateway(tmp_path, monkeypatch):
    from sglang_specsot import gateway

    class FakeServer:
        base_url = "http://127.0.0.1:31000"

        def __init__(self, target, args, env, log_path):
            assert "SGLANG_CPU_OMP_THREADS_BIND" not in env  # one server keeps every core

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr("sglang_specsot.launch.ServerProcess", FakeServer)
    monkeypatch.setattr(gateway, "gateway", None)  # never started
    with gateway.served("/m", [], {}, 1, "cache_aware", tmp_path) as (url, processes):
        assert url == "http://127.0.0.1:31000" and len(processes) == 1
