"""`python -m sglang_specsot.loadtest`: a bounded load test of a SPECSOT server with server-side SoT.

Starts a SPECSOT SmolLM2-135M server on this CPU (or connects to one with --url), runs
--clients concurrent clients on loopback for --duration seconds, each sending chat requests one
after another: plain or SoT (`"specsot": {"mode": "on"}`; with `--sot-mode auto`, the same
requests in mode "auto" and in mode "off"), streaming or not, and --fault-share of them cut at
random (the client disconnects, or a plain request is aborted by SGLang's
/abort_request). Then it stops sending, waits for the requests in flight, and reports sent /
completed / failed / aborted / lost, latency percentiles (plain vs SoT), the scheduler's RSS and
KV usage (/v1/loads) before and after, and the server's health. Exit status 1 when a request
failed or was lost, or the server is unhealthy or not idle afterwards.

    python -m sglang_specsot.loadtest --duration 300 --clients 32 --out load.json
    python -m sglang_specsot.loadtest --duration 300 --clients 32 --replicas 2 --out load-gateway.json

With `--replicas N` it starts N servers, each on its own cores, behind SGLang's gateway (`smg`,
`--policy`), sends every request to the gateway, and watches every replica's memory and health;
an abort goes to every replica (the one holding the rid cancels it).

With `--sot-mode auto` the report's latency "sot" is mode "auto" and "plain" the same requests
in mode "off", and `sot_paths` counts how the non-streamed "auto" answers were given ("sot" or
"normal", from `metadata.specsot.path`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from urllib.parse import urlparse

CLIENTS = 32
DURATION = 300.0  # seconds of sending; requests in flight at the end are then waited for
FAULT_SHARE = 0.1  # requests cut on purpose: a disconnect, or /abort_request on a plain one
SOT_SHARE = 0.5
STREAM_SHARE = 0.5
DRAIN_TIMEOUT = 900.0  # a request still running this long after the end counts as lost
SEED = 0
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
PLAIN_MAX_TOKENS = 64
SOT_MAX_TOKENS = 256  # room for the skeleton and every branch below, should it cap the total
SOT_CONFIG = {"skeleton_max_tokens": 64, "max_points": 4, "max_running": 2, "default_branch_tokens": 32,
              "min_branch_tokens": 8, "max_branch_tokens": 48, "router_min_answer_tokens": 1}  # fmt: skip
SERVER_ARGS = ["--device", "cpu", "--attention-backend", "specsot_cpu", "--max-total-tokens", "16384",
               "--mem-fraction-static", "0.3", "--sleep-on-idle", "--enable-custom-logit-processor",
               "--speculative-algorithm", "SPECSOT", "--speculative-num-draft-tokens", "6"]  # fmt: skip
QUESTIONS = [
    "How can I improve my time management skills?",
    "What are the benefits of learning a second language?",
    "How do I prepare for a job interview?",
    "What are some tips for staying healthy while working from home?",
    "What is 17 times 23?",
    "Translate 'good morning' into French.",
    "Write a haiku about the sea.",
    "What is the capital of Australia?",
]


@dataclass
class Outcome:
    """One request: what was sent and how it ended."""

    kind: str  # "plain" or "sot"
    stream: bool
    fault: str | None  # None, "disconnect" or "abort"
    status: str = "lost"  # completed | failed | aborted | lost (set when the request ends)
    latency: float | None = None  # seconds, for completed requests
    detail: str = ""
    path: str | None = None  # a non-streamed answer's metadata.specsot.path ("sot" or "normal")
    tokens: int | None = None  # a non-streamed answer's completion tokens
    question: int | None = None  # its index in QUESTIONS
    rule: str | None = None  # a non-streamed answer's route rule (metadata.specsot.route.rule)
    gate_wait: float | None = None  # seconds it waited for an SoT slot (route.gate_wait_seconds)


@dataclass
class Report:
    settings: dict = field(default_factory=dict)  # what ran: clients, duration, shares, SoT config
    wall_s: float = 0.0  # from the first request to the last one ending
    sent: int = 0
    completed: int = 0
    failed: int = 0
    aborted: int = 0
    lost: int = 0
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    sot_paths: dict[str, int] = field(default_factory=dict)  # how "sot" requests were answered
    tokens: dict[str, float] = field(default_factory=dict)  # mean completion tokens by kind (non-streamed)
    # The scheduler's row-cost curve at the end (/server_info's specsot_row_costs): with `tokens`
    # what `python -m sglang_specsot.bench scale-sim` needs to extrapolate this run.
    row_costs: dict | None = None
    # Every request as it ended (kind, question, stream, fault, status, latency, path, tokens):
    # what a difference between the kinds' latencies or lengths can be traced to.
    requests: list[dict] = field(default_factory=list)
    by_question: dict[str, dict[str, dict]] = field(default_factory=dict)  # see by_question()
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    rss_peak_mb: float | None = None
    rss_timeline_mb: list[float] = field(default_factory=list)  # the scheduler's RSS every 30 s
    # Beside it, every 30 s: where that memory goes (/server_info's specsot.memory: the C
    # allocator's in-use and kept-free bytes, Python's blocks, the prefix cache, the drafter).
    memory_timeline: list[dict] = field(default_factory=list)
    memory_trend: dict[str, float] = field(default_factory=dict)  # MB/min over the second half
    healthy_after: bool = False
    idle_after: bool = False
    failures: list[str] = field(default_factory=list)
    # With --replicas N > 1, behind the gateway: every replica's own figures (url, before, after,
    # rss_peak_mb, memory_timeline, memory_trend, row_costs, healthy_after, idle_after); the
    # fields above are then the first replica's.
    replicas: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        every = self.replicas or [{"healthy_after": self.healthy_after, "idle_after": self.idle_after}]
        return not self.failed and not self.lost and all(r["healthy_after"] and r["idle_after"] for r in every)


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


def request_body(kind: str, stream: bool, question: str, rid: str, sot_mode: str = "on",
                 model: str = "default") -> dict:
    """A chat request: "sot" in `sot_mode`; "plain" a short plain one, or with `sot_mode` "auto"
    the same request as "sot" in mode "off", so the two kinds' latencies compare like for like."""
    body = {"model": model, "messages": [{"role": "user", "content": question}], "temperature": 0.7,
            "stream": stream, "max_tokens": PLAIN_MAX_TOKENS, "rid": rid}  # fmt: skip
    if kind == "sot" or sot_mode == "auto":
        mode = sot_mode if kind == "sot" else "off"
        body.update(max_tokens=SOT_MAX_TOKENS, specsot={"mode": mode, "config": SOT_CONFIG})
    if kind == "sot":
        del body["rid"]  # SoT names its own generations; a client rid would name none of them
    return body


def run_one(fleet: Fleet, outcome: Outcome, body: dict, rng: random.Random) -> None:
    """Send one request and classify how it ended; a request cut before it ended counts as
    aborted unless the server answered it with a 5xx."""
    conn = http.client.HTTPConnection(fleet.host, fleet.port, timeout=DRAIN_TIMEOUT)
    started = time.monotonic()
    cutter, fired = None, threading.Event()
    if outcome.fault:
        act = (lambda: _close(conn)) if outcome.fault == "disconnect" else (lambda: _abort(fleet, body["rid"]))
        cutter = threading.Timer(rng.uniform(0.2, 8.0), lambda: (fired.set(), act()))
        cutter.start()
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
        error = _error_in(response.status, raw, outcome.stream)
    except (OSError, http.client.HTTPException) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if cutter:
            cutter.cancel()
        conn.close()
    if fired.is_set() and not (error or "").startswith("HTTP 5"):
        outcome.status, outcome.detail = "aborted", error or ""
    elif error:
        outcome.status, outcome.detail = "failed", error
    else:
        outcome.status, outcome.latency = "completed", time.monotonic() - started
        if not outcome.stream:
            reply = json.loads(raw)
            meta = (reply.get("metadata") or {}).get("specsot") or {}
            route = meta.get("route") or {}
            outcome.path, outcome.rule, outcome.gate_wait = meta.get("path"), route.get("rule"), route.get("gate_wait_seconds")
            outcome.tokens = (reply.get("usage") or {}).get("completion_tokens")


def _error_in(status: int, raw: bytes, stream: bool) -> str | None:
    if status != 200:
        return f"HTTP {status}: {raw[:300].decode(errors='replace')}"
    if not stream:
        reply = json.loads(raw)
        return None if reply.get("choices") else f"no choices: {raw[:300]!r}"
    events = [line[6:] for line in raw.decode(errors="replace").splitlines() if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return f"stream without [DONE]: {raw[-300:]!r}"
    errors = [e for e in events[:-1] if '"error"' in e]
    return f"error in stream: {errors[0][:300]}" if errors else None


def _close(conn: http.client.HTTPConnection) -> None:
    if conn.sock is not None:
        conn.sock.close()


def _abort(fleet: Fleet, rid: str) -> None:
    """SGLang's /abort_request on every replica: the gateway chose one, and the others have
    no request of that rid (an abort there does nothing)."""
    for server in fleet.replicas:
        try:
            server.post("/abort_request", {"rid": rid}, timeout=30)
        except OSError:
            pass  # the request may have ended already


def client(fleet: Fleet, index: int, stop_at: float, outcomes: list[Outcome], lock: threading.Lock, args) -> None:
    rng = random.Random(args.seed * 1000 + index)
    n = 0
    while time.monotonic() < stop_at:
        n += 1
        kind = "sot" if rng.random() < args.sot_share else "plain"
        stream = rng.random() < args.stream_share
        fault = None
        if rng.random() < args.fault_share:
            fault = "abort" if kind == "plain" and rng.random() < 0.5 else "disconnect"
        question = rng.randrange(len(QUESTIONS))
        outcome = Outcome(kind, stream, fault, question=question)
        with lock:
            outcomes.append(outcome)
        body = request_body(kind, stream, QUESTIONS[question], f"load-{args.seed}-{index}-{n}", args.sot_mode,
                            fleet.model)
        run_one(fleet, outcome, body, rng)


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"n": len(values), "p50": round(pick(0.5), 2), "p90": round(pick(0.9), 2),
            "p95": round(pick(0.95), 2), "p99": round(pick(0.99), 2), "max": round(values[-1], 2)}  # fmt: skip


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


def run_load(fleet: Fleet, args) -> Report:
    names = ("clients", "duration", "sot_mode", "sot_share", "stream_share", "fault_share", "seed")
    settings = {k: getattr(args, k) for k in names}
    settings.update(plain_max_tokens=PLAIN_MAX_TOKENS, sot_max_tokens=SOT_MAX_TOKENS, sot_config=SOT_CONFIG)
    several = len(fleet.replicas) > 1
    settings.update(replicas=len(fleet.replicas), policy=getattr(args, "policy", None) if several else None)
    # oneDNN caches one primitive per new matmul shape (1,024 by default): most of the native
    # heap's growth under load, so a memory reading means little without it.
    settings["onednn_primitive_cache_capacity"] = os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "default")
    watches = [Watch(server) for server in fleet.replicas]
    report = Report(settings=settings)
    began = time.monotonic()
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + args.duration
    threads = [threading.Thread(target=client, args=(fleet, i, stop_at, outcomes, lock, args), daemon=True)
               for i in range(args.clients)]  # fmt: skip
    for thread in threads:
        thread.start()
    ticks = 0
    while any(t.is_alive() for t in threads) and time.monotonic() < stop_at + DRAIN_TIMEOUT:
        time.sleep(5.0)
        ticks += 1
        for watch in watches:
            watch.tick(time.monotonic() - began, record=ticks % 6 == 0)
        done = sum(o.status != "lost" for o in outcomes)
        print(f"[{time.monotonic() - stop_at + args.duration:6.0f}s] sent {len(outcomes)}, ended {done}", flush=True)
    report.wall_s = round(time.monotonic() - began, 1)
    replicas = [watch.finish(time.monotonic() - began) for watch in watches]
    first = replicas[0]
    report.before, report.after, report.rss_peak_mb = first["before"], first["after"], first["rss_peak_mb"]
    report.rss_timeline_mb, report.memory_timeline = first["rss_timeline_mb"], first["memory_timeline"]
    report.memory_trend, report.row_costs = first["memory_trend"], first["row_costs"]
    report.healthy_after, report.idle_after = first["healthy_after"], first["idle_after"]
    report.replicas = replicas if len(replicas) > 1 else []
    _tally(report, outcomes)
    return report


def _row_costs(server: Server) -> dict | None:
    try:
        return server.get("/server_info")["internal_states"][0].get("specsot_row_costs")
    except (OSError, KeyError, IndexError, ValueError):
        return None


def _tally(report: Report, outcomes: list[Outcome]) -> None:
    report.sent = len(outcomes)
    report.requests = [{k: v for k, v in asdict(o).items() if k != "detail"} for o in outcomes]
    for o in outcomes:
        setattr(report, o.status, getattr(report, o.status) + 1)
        if o.status in ("failed", "lost"):
            report.failures.append(f"{o.kind} stream={o.stream} fault={o.fault}: {o.status} {o.detail}")
    for kind in ("plain", "sot"):
        report.latency[kind] = percentiles([o.latency for o in outcomes if o.kind == kind and o.latency is not None])
        counted = [o.tokens for o in outcomes if o.kind == kind and o.tokens is not None]
        if counted:
            report.tokens[kind] = round(sum(counted) / len(counted), 1)
    for o in outcomes:
        if o.kind == "sot" and o.status == "completed" and not o.stream:
            report.sot_paths[o.path or "unknown"] = report.sot_paths.get(o.path or "unknown", 0) + 1
    report.by_question = by_question(outcomes)


def by_question(outcomes: list[Outcome]) -> dict[str, dict[str, dict]]:
    """Per question, the completed non-streamed answers by what answered them: "plain" (the
    requests sent "off" in mode auto), "sot:sot" and "sot:normal" (the "sot" requests by their
    path): count, median latency, mean tokens, and for SoT the median wait for an SoT slot.
    Questions' answers differ in length, so kinds compare here question by question."""
    groups: dict[str, dict[str, list[Outcome]]] = {}
    for o in outcomes:
        if o.status == "completed" and not o.stream and o.question is not None:
            name = o.kind if o.kind == "plain" else f"sot:{o.path or 'unknown'}"
            groups.setdefault(str(o.question), {}).setdefault(name, []).append(o)
    table: dict[str, dict[str, dict]] = {}
    for question, kinds in sorted(groups.items(), key=lambda kv: int(kv[0])):
        for name, done in sorted(kinds.items()):
            row = {"n": len(done), "p50_s": round(statistics.median(o.latency for o in done), 2)}
            tokens = [o.tokens for o in done if o.tokens is not None]
            row["tokens"] = round(statistics.mean(tokens), 1) if tokens else None
            waits = [o.gate_wait for o in done if o.gate_wait is not None]
            if name == "sot:sot" and waits:
                row["gate_wait_p50_s"] = round(statistics.median(waits), 2)
            table.setdefault(question, {})[name] = row
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_specsot.loadtest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an already running server (default: start SPECSOT SmolLM2-135M here)")
    parser.add_argument("--model", default="smollm2-135m", help="model to fetch and serve when --url is not given")
    parser.add_argument("--clients", type=int, default=CLIENTS)
    parser.add_argument("--duration", type=float, default=DURATION, help="seconds of sending")
    parser.add_argument("--sot-mode", choices=("on", "auto"), default="on",
                        help='the mode of "sot" requests; with "auto", "plain" requests are the same in mode "off"')
    parser.add_argument("--sot-share", type=float, default=SOT_SHARE)
    parser.add_argument("--stream-share", type=float, default=STREAM_SHARE)
    parser.add_argument("--fault-share", type=float, default=FAULT_SHARE)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--replicas", type=int, default=1,
                        help="start this many servers, each on its own cores, behind SGLang's gateway (smg)")
    parser.add_argument("--policy", default="cache_aware", help="the gateway's routing policy, with --replicas > 1")
    parser.add_argument("--out", help="also write the report here as JSON")
    args = parser.parse_args(argv)
    if args.url and urlparse(args.url).hostname not in LOOPBACK:
        parser.error(f"--url {args.url}: the load test sends only to this machine (loopback: {sorted(LOOPBACK)}); "
                     "run it on the server's host")  # fmt: skip
    if args.url and args.replicas != 1:
        parser.error("--replicas starts its servers and gateway here; --url names one running server instead")
    if args.url:
        report = run_load(Fleet(args.url, [Server(args.url, None)]), args)
    else:
        report = _with_own_server(args)
    text = json.dumps({**asdict(report), "ok": report.ok}, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text + "\n")
    return 0 if report.ok else 1


def _with_own_server(args) -> Report:
    from sglang_specsot.gateway import served

    path = _fetch(args.model)
    # SGLang's strict idle memory check: a leaked KV slot or request row found once the load
    # is over kills the scheduler, and the server then fails the health check here.
    strict = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}
    with served(path, SERVER_ARGS, strict, args.replicas, args.policy) as (url, processes):
        for process in processes:
            print(f"server on {process.base_url}, log {process.log_path}", flush=True)
        if args.replicas > 1:
            print(f"gateway ({args.policy}) on {url}", flush=True)
        servers = [Server(p.base_url, p.proc.pid) for p in processes]
        model = servers[0].get("/v1/models")["data"][0]["id"]
        return run_load(Fleet(url, servers, model), args)


def _fetch(name: str) -> str:
    import subprocess

    out = subprocess.run([sys.executable, "-m", "sglang_specsot.models", "fetch", name],
                         check=True, stdout=subprocess.PIPE, text=True)  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


def _stop_on_sigterm() -> None:
    """SIGTERM (`kill PID`) unwinds like Ctrl-C, so the servers and the gateway this run
    started are stopped (Python's default SIGTERM exits without unwinding)."""
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


if __name__ == "__main__":
    _stop_on_sigterm()
    sys.exit(main())
