"""Start and stop a real `python -m sglang.launch_server` on this machine's CPU.

Shared by the integration tests, the examples and the benchmarks, so that all of them run
the server exactly as the README tells a user to.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def cpu_server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a CPU server needs: SGLang's CPU switch and the venv's tools.

    OpenMP's wait policy is left to the plugin (cpu/threads.py: workers spin ~0.1 s, then
    sleep), as on a server a user starts: OMP_WAIT_POLICY=PASSIVE here would make every
    region of a step wait for a sleeping worker, and tests would time a slower server."""
    env = dict(os.environ)
    env["SGLANG_USE_CPU_ENGINE"] = "1"  # SGLang's own gate for its CPU path (utils/common.py:221)
    # SGLang JIT-builds the NGRAM corpus with the `ninja` on PATH; ours lives in the venv.
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    env.setdefault("HF_HUB_OFFLINE", "1")  # no model hub here; fail fast instead of retrying
    env.update(extra or {})
    return env


# SGLang picks its own later-bound ports (nccl_port) from 22000-29999, below the kernel's
# ephemeral range; ours sit between the two so neither can take the other's.
_PORT_LOW = 30000
_BIND_FAILED = "address already in use"
_START_ATTEMPTS = 3


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free port the server binds seconds later, outside the kernel's ephemeral range.

    A port from bind(0) is an ephemeral one: while the server starts, any outgoing
    connection (its own TCPStore clients, the health probe) may be handed the same port,
    and uvicorn then fails to bind it (rare, but seen in CI).

    The same idea as SGLang's `get_free_port_below_ephemeral` (srt/utils/network.py), with
    a range that avoids SGLang's own; not called, because importing it imports torch (seconds)
    and this module stays stdlib-only for the examples' client processes.
    """
    high = _ephemeral_low() - 1
    if high - _PORT_LOW >= 64:
        for port in random.sample(range(_PORT_LOW, high + 1), 64):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # a narrowed ephemeral range leaves no room below it
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PortTakenError(RuntimeError):
    """The server could not bind its HTTP port; it never serves, so it is stopped at once."""


@dataclass
class ServerProcess:
    """A launched SGLang server; use as a context manager so it is always torn down."""

    model_path: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    port: int = 0
    startup_timeout: float = 600.0
    proc: subprocess.Popen | None = field(default=None, init=False)  # set by start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", self.model_path,
            "--host", "127.0.0.1", "--port", str(self.port),
            *self.args,
        ]  # fmt: skip

    def start(self) -> ServerProcess:
        """Launch and wait until healthy; a port lost to a race is retried on a new one."""
        chosen = not self.port  # a port the caller named is never swapped behind its back
        for attempt in range(1, _START_ATTEMPTS + 1):
            self.port = self.port or free_port()
            try:
                self._launch()
                return self
            except PortTakenError:
                if not chosen or attempt == _START_ATTEMPTS:
                    raise
                self.port = 0
        raise AssertionError("unreachable")

    def _launch(self) -> None:
        if self.log_path is None:
            self.log_path = Path(f"/tmp/sglang-specsot-server-{self.port}.log")
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            self.command(),
            env=cpu_server_env(self.env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so stop() reaches every child
        )
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"SGLang server exited with code {self.proc.returncode} during start-up; "
                    f"last log lines:\n{self.log_tail()}"
                )
            if self._bind_failed():
                # uvicorn logs the failure and then hangs in shutdown instead of exiting.
                self.stop()
                raise PortTakenError(
                    f"SGLang server could not bind port {self.port}; log:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.base_url + "/health_generate", timeout=60) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(
            f"SGLang server not healthy after {self.startup_timeout:.0f}s; log:\n{self.log_tail()}"
        )

    def _bind_failed(self) -> bool:
        if not self.log_path or not self.log_path.exists():
            return False
        return _BIND_FAILED in self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        # SIGTERM to the server process alone lets SGLang shut its children down in order
        # (signalling the whole group makes it report a crashed scheduler); then make sure.
        try:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- small HTTP helpers (stdlib only, so the examples need nothing extra) ---------------

    def post(self, path: str, payload: dict, timeout: float = 600.0) -> dict:
        req = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def get(self, path: str, timeout: float = 60.0) -> dict:
        with urllib.request.urlopen(self.base_url + path, timeout=timeout) as r:
            return json.loads(r.read())
