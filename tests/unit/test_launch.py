"""ServerProcess start-up: a lost port race is seen at once and retried, not waited out."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from sglang_specsot import launch
from sglang_specsot.launch import PortTakenError, ServerProcess, free_port

# Stands in for `sglang.launch_server`: like uvicorn, it logs the bind failure and then hangs.
FAKE_SERVER = r"""
import http.server, sys, time
port = int(sys.argv[1])

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass

try:
    server = http.server.HTTPServer(("127.0.0.1", port), Health)
except OSError as e:
    print(f"ERROR:    [Errno 98] error while attempting to bind on address "
          f"('127.0.0.1', {port}): address already in use", flush=True)
    time.sleep(600)
server.serve_forever()
"""


class FakeServer(ServerProcess):
    def command(self) -> list[str]:
        return [sys.executable, "-c", FAKE_SERVER, str(self.port)]


@pytest.fixture
def taken_port():
    # Bound, not listening: like an outgoing connection that holds the port.
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
        yield s.getsockname()[1]


def test_free_port_is_below_the_ephemeral_range_and_free():
    port = free_port()
    assert launch._PORT_LOW <= port < launch._ephemeral_low()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_named_port_that_is_taken_fails_fast_with_the_log(taken_port, tmp_path):
    server = FakeServer("unused", port=taken_port, log_path=tmp_path / "s.log", startup_timeout=60)
    started = time.monotonic()
    with pytest.raises(PortTakenError, match=f"could not bind port {taken_port}"):
        server.start()
    assert time.monotonic() - started < 30  # not the startup timeout
    assert server.proc.poll() is not None  # the hung process was stopped


def test_a_chosen_port_lost_to_a_race_is_retried_on_a_new_one(taken_port, tmp_path, monkeypatch):
    ports = iter([taken_port, free_port()])
    monkeypatch.setattr(launch, "free_port", lambda: next(ports))
    with FakeServer("unused", log_path=tmp_path / "s.log", startup_timeout=60) as server:
        assert server.port != taken_port
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass
