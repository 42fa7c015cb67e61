"""The servers under load, as the load test sees them over HTTP and /proc: requests, load,
health, the scheduler's memory (`Server`); where clients send (`Fleet`: one server, or the
gateway before several); and each replica's memory watched over the run (`Watch`)."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlparse


class Server:
    """The HTTP side of the server under load: requests, load, health, the scheduler's RSS."""

    def __init__(self, url: str, pid: int | None) -> None:
        parsed = urlparse(url)
        self.url, self.host, self.port = url.rstrip("/"), parsed.hostname, parsed.port
        # The HTTP server's process runs server-side SoT (tokenizer manager, SoT runner).
        self.http = _server_process(pid, self.port)
        self.scheduler = _scheduler_process(self.http)

    def get(self, path: str, timeout: float = 60.0) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return json.loads(r.read() or b"{}")

    def post(self, path: str, body: dict, timeout: float = 600.0) -> bytes:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read()

    def state(self) -> dict:
        """KV and request counts from /v1/loads and the scheduler's RSS."""
        load = self.get("/v1/loads")["loads"][0]
        keys = ("num_running_reqs", "num_waiting_reqs", "num_used_tokens", "max_total_num_tokens", "token_usage")
        state = {k: load.get(k) for k in keys}
        state["scheduler_rss_mb"] = self.rss_mb()
        state["http_rss_mb"] = _rss_mb(self.http)
        return state

    def memory(self, elapsed_s: float) -> dict:
        """The scheduler's RSS and SPECSOT's memory figures (none from other servers)."""
        entry = {"t_s": round(elapsed_s), "rss_mb": self.rss_mb(), "http_rss_mb": _rss_mb(self.http)}
        try:
            state = self.get("/server_info")["internal_states"][0]
        except (OSError, ValueError, KeyError, IndexError) as e:
            return {**entry, "error": f"/server_info: {e!r}"}
        return {**entry, **(state.get("specsot", {}).get("memory") or {})}

    def rss_mb(self) -> float | None:
        """The scheduler's RSS."""
        return _rss_mb(self.scheduler)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health_generate", timeout=120) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_idle(self, timeout: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state()
            if state["num_running_reqs"] == state["num_waiting_reqs"] == 0:
                return True
            time.sleep(1.0)
        return False


@dataclass
class Fleet:
    """Where the clients send (`url`: the one server, or the gateway before several) and the
    servers that answer (`replicas`), watched one by one."""

    url: str
    replicas: list[Server]
    model: str = "default"  # the served name: the gateway routes by it (a server takes any)

    @property
    def host(self) -> str | None:
        return urlparse(self.url).hostname

    @property
    def port(self) -> int | None:
        return urlparse(self.url).port


def _server_process(pid: int | None, port: int):
    """The server's main process (HTTP and tokenizer manager), from its pid or from whoever
    listens on the port."""
    import psutil

    if pid is None:
        listeners = [c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
                     and c.status == psutil.CONN_LISTEN and c.pid]  # fmt: skip
        pid = listeners[0] if listeners else None
    return psutil.Process(pid) if pid is not None else None


def _scheduler_process(server):
    """SGLang's scheduler (process title sglang::scheduler...) under the server process."""
    if server is None:
        return None
    for child in server.children(recursive=True):
        if "scheduler" in " ".join(child.cmdline()) or "scheduler" in child.name():
            return child
    return None


def _rss_mb(process) -> float | None:
    return round(process.memory_info().rss / 2**20, 1) if process is not None else None


def memory_trend(timeline: list[dict]) -> dict[str, float]:
    """MB per minute over the second half of the run (least squares), per memory figure: the
    first half includes stores filling to their bounds; flat memory shows as slopes near 0."""
    half = [e for e in timeline if e.get("t_s", 0) >= timeline[-1].get("t_s", 0) / 2] if timeline else []
    figures = {"scheduler_rss": lambda e: e.get("rss_mb"), "http_rss": lambda e: e.get("http_rss_mb"),
               "malloc_in_use": lambda e: (e.get("malloc") or {}).get("in_use_mb")}  # fmt: skip
    trend = {}
    for name, read in figures.items():
        points = [(e["t_s"] / 60, read(e)) for e in half if read(e) is not None]
        if len(points) >= 3:
            trend[f"{name}_mb_per_min"] = round(_slope(points), 2)
    return trend


def _slope(points: list[tuple[float, float]]) -> float:
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0


class Watch:
    """One replica's memory over the run: RSS every 5 s (its peak), figures every 30 s."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.before = server.state()
        self.peak = self.before["scheduler_rss_mb"] or 0.0
        self.rss_timeline: list[float] = []
        self.timeline = [server.memory(0.0)]

    def tick(self, elapsed_s: float, record: bool) -> None:
        rss = self.server.rss_mb() or 0.0
        self.peak = max(self.peak, rss)
        if record:
            self.rss_timeline.append(rss)
            self.timeline.append(self.server.memory(elapsed_s))

    def finish(self, elapsed_s: float) -> dict:
        """The replica's figures once the load is over and it had time to go idle."""
        idle = self.server.wait_idle()
        time.sleep(5.0)  # a few idle turns of the scheduler, each with its memory check
        self.timeline.append(self.server.memory(elapsed_s + 5.0))
        return {"url": self.server.url, "before": self.before, "after": self.server.state(),
                "rss_peak_mb": self.peak or None, "rss_timeline_mb": self.rss_timeline,
                "memory_timeline": self.timeline, "memory_trend": memory_trend(self.timeline),
                "row_costs": _row_costs(self.server), "healthy_after": self.server.healthy(),
                "idle_after": idle}  # fmt: skip


def _row_costs(server: Server) -> dict | None:
    try:
        return server.get("/server_info")["internal_states"][0].get("specsot_row_costs")
    except (OSError, KeyError, IndexError, ValueError):
        return None
