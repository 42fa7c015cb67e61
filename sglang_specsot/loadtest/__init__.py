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
The package: the clients (clients.py), the servers under load and their watching
(fleet.py), what is counted (tally.py); the run and its command line are here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import asdict
from urllib.parse import urlparse

from sglang_specsot.loadtest.clients import DRAIN_TIMEOUT, PLAIN_MAX_TOKENS, SOT_CONFIG, SOT_MAX_TOKENS, client
from sglang_specsot.loadtest.fleet import Fleet, Server, Watch
from sglang_specsot.loadtest.tally import Outcome, Report, tally

CLIENTS = 32
DURATION = 300.0  # seconds of sending; requests in flight at the end are then waited for
FAULT_SHARE = 0.1  # requests cut on purpose: a disconnect, or /abort_request on a plain one
SOT_SHARE = 0.5
STREAM_SHARE = 0.5
SEED = 0
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
SERVER_ARGS = ["--device", "cpu", "--attention-backend", "specsot_cpu", "--max-total-tokens", "16384",
               "--mem-fraction-static", "0.3", "--sleep-on-idle", "--enable-custom-logit-processor",
               "--speculative-algorithm", "SPECSOT", "--speculative-num-draft-tokens", "6"]  # fmt: skip


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
    tally(report, outcomes)
    return report


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


def stop_on_sigterm() -> None:
    """SIGTERM (`kill PID`) unwinds like Ctrl-C, so the servers and the gateway this run
    started are stopped (Python's default SIGTERM exits without unwinding)."""
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
