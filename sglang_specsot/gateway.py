"""SGLang's model gateway (`smg`, pinned in requirements/dev.lock) in front of replicas here.

Shared by the load test and the integration tests, so both run the gateway as README section 5
tells a user to: `smg launch --policy P --worker-urls URL...`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

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
    """The `smg` executable beside this Python, else on PATH; FileNotFoundError naming the fix."""
    found = shutil.which("smg", path=str(Path(sys.executable).parent)) or shutil.which("smg")
    if found is None:
        raise FileNotFoundError("the `smg` gateway is not installed: scripts/setup.sh installs it "
                                "from requirements/dev.lock (or `pip install smg==1.13.0`)")  # fmt: skip
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
        proc.terminate()  # only the process this block started; it drains open requests first
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def core_sets(replicas: int, cores: int | None = None) -> list[str]:
    """SGLANG_CPU_OMP_THREADS_BIND values giving each of `replicas` CPU servers its own
    contiguous cores ("0", "1" for two on two cores; "0-3", "4-7" for two on eight), so they
    do not share a core; ValueError when there are fewer cores than replicas."""
    cores = cores or os.cpu_count() or 1
    if replicas < 1 or replicas > cores:
        raise ValueError(f"replicas={replicas}: each CPU replica needs a core of its own and this machine has "
                         f"{cores}; use 1 to {cores} replicas")  # fmt: skip
    share, extra = divmod(cores, replicas)
    sets, first = [], 0
    for i in range(replicas):
        last = first + share + (i < extra) - 1
        sets.append(str(first) if first == last else f"{first}-{last}")
        first = last + 1
    return sets


@contextmanager
def served(model_path: str, server_args: list[str], env: dict[str, str], replicas: int, policy: str,
           logs: Path | None = None, name: str = "server") -> Iterator[tuple[str, list]]:
    """The URL clients send to and the `ServerProcess`es behind it: one server, or `replicas`
    servers each on its own cores (SGLANG_CPU_OMP_THREADS_BIND) behind the gateway, as README
    section 5 runs them. Logs go to `logs/NAME-I.log` and `logs/smg-NAME.log` (default: /tmp)."""
    from sglang_specsot.launch import ServerProcess  # looked up at call time: tests stand in for it

    binds = [{}] if replicas == 1 else [{"SGLANG_CPU_OMP_THREADS_BIND": c} for c in core_sets(replicas)]
    with ExitStack() as stack:
        processes = [stack.enter_context(ServerProcess(model_path, server_args, env | bind,
                                                       log_path=logs / f"{name}-{i}.log" if logs else None))
                     for i, bind in enumerate(binds)]  # fmt: skip
        urls = [p.base_url for p in processes]
        if replicas == 1:
            yield urls[0], processes
        else:
            log = (logs / f"smg-{name}.log") if logs else processes[0].log_path.with_name(f"smg-{processes[0].port}.log")
            yield stack.enter_context(gateway(urls, log, policy=policy)), processes
