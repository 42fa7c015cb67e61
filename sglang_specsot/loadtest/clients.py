"""The load test's clients: each sends chat requests one after another (plain or SoT,
streamed or not, some cut on purpose) and records how each ended in an `Outcome`."""

from __future__ import annotations

import http.client
import json
import random
import threading
import time

from sglang_specsot.loadtest.fleet import Fleet
from sglang_specsot.loadtest.tally import Outcome

DRAIN_TIMEOUT = 900.0  # a request still running this long after the end counts as lost
PLAIN_MAX_TOKENS = 64
SOT_MAX_TOKENS = 256  # room for the skeleton and every branch below, should it cap the total
SOT_CONFIG = {"skeleton_max_tokens": 64, "max_points": 4, "max_running": 2, "default_branch_tokens": 32,
              "min_branch_tokens": 8, "max_branch_tokens": 48, "router_min_answer_tokens": 1}  # fmt: skip
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
