"""How latency and throughput scale over replicas behind the gateway, simulated from one replica's
measured costs.

Each replica is SGLang's continuous batching reduced to its costs: a forward of r rows takes the
replica's measured `RowCosts.step_ms(r)` (the start-up probe plus the overhead learned from its
steps, as `/server_info` reports under `specsot_row_costs`). A replica with requests waiting and
a free slot runs a prefill forward of their prompt tokens; otherwise a decode forward advances
every running sequence by one token. A plain answer is one sequence; a SoT answer is its
skeleton, then its points as branches on the same replica (server-side SoT: the gateway routes
the request, never a branch), at most the plan's `max_running` at once; in mode `auto` the
replica prices it with the latency model (sot/latency.py) on its load at arrival, as the server
does. Clients are closed-loop, as in `python -m sglang_specsot.loadtest`: each sends its next
request when the last is answered.

The gateway's policies reduced to what decides here: `round_robin` in turn; `least_load` (smg's
policy of that name) to the replica with the fewest running and waiting sequences, which is also
what smg's `cache_aware` does while loads are unbalanced (otherwise it follows prefix matches,
which distinct questions do not have).

Plain Python: what it predicts is only as good as the curve and lengths it is given; the
measured load test it is checked against is in docs/scale-out.md.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from dataclasses import dataclass, field

from sglang_specsot.loadtest.tally import percentiles
from sglang_specsot.sot.latency import BRANCH_SUFFIX_TOKENS, AnswerShape, RowCosts, ServerLoad, decide

POLICIES = ("round_robin", "least_load")
SOT_MODES = ("on", "auto", "off")


@dataclass(frozen=True, slots=True)
class Workload:
    """What the clients send: `clients` closed-loop clients, a `sot_share` of their requests
    asking for SoT in `sot_mode`, every answer of `shape`'s lengths."""

    clients: int
    shape: AnswerShape
    sot_share: float = 0.5
    sot_mode: str = "auto"
    # Each answer's lengths drawn from shape's times U(1 - spread, 1 + spread): answers differ
    # in length, and with one length for all every percentile would be the same.
    length_spread: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.clients, int) or self.clients < 1:
            raise ValueError(f"clients={self.clients!r} must be a positive number of clients")
        if not 0.0 <= self.sot_share <= 1.0:
            raise ValueError(f"sot_share={self.sot_share!r} must lie in [0, 1]")
        if self.sot_mode not in SOT_MODES:
            raise ValueError(f"sot_mode={self.sot_mode!r} must be one of {SOT_MODES}")
        if not 0.0 <= self.length_spread < 1.0:
            raise ValueError(f"length_spread={self.length_spread!r} must lie in [0, 1)")


@dataclass(frozen=True, slots=True)
class Deployment:
    """`replicas` identical replicas of `costs`, each running at most `max_running` sequences,
    behind the gateway's `policy`."""

    replicas: int
    costs: RowCosts
    policy: str = "least_load"
    max_running: int = 32

    def __post_init__(self) -> None:
        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise ValueError(f"replicas={self.replicas!r} must be a positive number of replicas")
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r} must be one of {POLICIES}")
        if not isinstance(self.max_running, int) or self.max_running < 1:
            raise ValueError(f"max_running={self.max_running!r} must be a positive number of sequences")


@dataclass(frozen=True, slots=True)
class ScaleResult:
    """One simulated run: latencies (s) by how each answer was given, and throughput."""

    replicas: int
    clients: int
    policy: str
    seconds: float
    completed: int
    tokens_per_s: float
    requests_per_s: float
    latency: dict  # "normal" / "sot" (how answered), "asked_sot" / "others" (what was asked) -> loadtest.percentiles
    sot_chosen: float | None  # share of SoT-asking requests answered by SoT (mode auto)

    def info(self) -> dict:
        return {"replicas": self.replicas, "clients": self.clients, "policy": self.policy,
                "seconds": self.seconds, "completed": self.completed,
                "tokens_per_s": round(self.tokens_per_s, 2), "requests_per_s": round(self.requests_per_s, 3),
                "latency": self.latency, "sot_chosen": self.sot_chosen}  # fmt: skip


@dataclass(eq=False)
class _Seq:
    request: _Request
    prompt: int  # tokens its prefill forward carries
    left: int  # tokens still to decode


@dataclass(eq=False)
class _Request:
    client: int
    sent_s: float
    sot: bool
    asked_sot: bool
    branches: deque = field(default_factory=deque)  # branch lengths not yet started
    open: int = 0  # sequences started and not finished
    tokens: int = 0


@dataclass(eq=False)
class _Replica:
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    busy: bool = False

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)


def simulate(deployment: Deployment, workload: Workload, seconds: float = 600.0, warmup_s: float = 60.0,
             seed: int = 0) -> ScaleResult:  # fmt: skip
    """Run the deployment under the workload for `seconds` of simulated time; what completes
    after `warmup_s` is measured."""
    if seconds <= warmup_s or warmup_s < 0:
        raise ValueError(f"seconds={seconds!r} must exceed warmup_s={warmup_s!r} >= 0")
    return _Run(deployment, workload, seed).run(seconds, warmup_s)


class _Run:
    def __init__(self, deployment: Deployment, workload: Workload, seed: int) -> None:
        self.d, self.w, self.rng = deployment, workload, random.Random(seed)
        self.replicas = [_Replica() for _ in range(deployment.replicas)]
        self.events: list = []  # (time_s, order, replica index, sequences of the forward)
        self.order = itertools.count()
        self.turn = itertools.count()
        self.done: list[tuple[float, _Request]] = []

    def run(self, seconds: float, warmup_s: float) -> ScaleResult:
        for client in range(self.w.clients):
            self._send(client, 0.0)
        while self.events and self.events[0][0] < seconds:
            now, _, index, batch = heapq.heappop(self.events)
            self._finish_forward(index, batch, now)
        return self._result(seconds, warmup_s)

    # -- clients and the gateway ------------------------------------------------------------

    def _send(self, client: int, now: float) -> None:
        asked = self.rng.random() < self.w.sot_share and self.w.sot_mode != "off"
        index = self._route()
        replica = self.replicas[index]
        sot = asked and (self.w.sot_mode == "on" or self._priced_sot(replica))
        request = _Request(client, now, sot, asked)
        shape = self.w.shape
        if sot:
            request.branches = deque(self._drawn(b) for b in shape.branch_tokens)
            self._start(replica, request, shape.skeleton_prompt_tokens, self._drawn(shape.skeleton_tokens))
        else:
            self._start(replica, request, shape.prompt_tokens, self._drawn(shape.normal_tokens))
        self._kick(index, now)

    def _drawn(self, tokens: int) -> int:
        spread = self.w.length_spread
        return max(1, round(tokens * self.rng.uniform(1 - spread, 1 + spread))) if spread else tokens

    def _route(self) -> int:
        if self.d.policy == "round_robin":
            return next(self.turn) % self.d.replicas
        return min(range(self.d.replicas), key=lambda i: (self.replicas[i].load, i))

    def _priced_sot(self, replica: _Replica) -> bool:
        load = ServerLoad(len(replica.running), len(replica.waiting), self.d.max_running)
        return decide(self.d.costs, load, self.w.shape).use_sot

    # -- one replica's forwards ---------------------------------------------------------------

    def _start(self, replica: _Replica, request: _Request, prompt: int, tokens: int) -> None:
        request.open += 1
        replica.waiting.append(_Seq(request, max(1, prompt), max(1, tokens)))

    def _kick(self, index: int, now: float) -> None:
        replica = self.replicas[index]
        if replica.busy:
            return
        free = self.d.max_running - len(replica.running)
        if replica.waiting and free > 0:
            batch = [replica.waiting.popleft() for _ in range(min(free, len(replica.waiting)))]
            rows = sum(s.prompt for s in batch)
            replica.running.extend(batch)
        elif replica.running:
            batch, rows = list(replica.running), len(replica.running)
        else:
            return
        replica.busy = True
        ms = self.d.costs.step_ms(rows)
        heapq.heappush(self.events, (now + ms / 1000.0, next(self.order), index, batch))

    def _finish_forward(self, index: int, batch: list[_Seq], now: float) -> None:
        replica = self.replicas[index]
        replica.busy = False
        for seq in batch:  # a prefill forward also samples the sequence's first token
            seq.left -= 1
            seq.request.tokens += 1
            if seq.left <= 0:
                replica.running.remove(seq)
                self._seq_done(replica, seq, now)
        self._kick(index, now)

    def _seq_done(self, replica: _Replica, seq: _Seq, now: float) -> None:
        request = seq.request
        request.open -= 1
        shape = self.w.shape
        if request.sot and request.branches:
            first = len(request.branches) == len(shape.branch_tokens)
            while request.branches and request.open < shape.max_running:
                # The branches' shared prompt (question and skeleton) is prefilled once, with the
                # first branch; each branch prefills its own last line.
                prompt = BRANCH_SUFFIX_TOKENS + (shape.branch_prompt_tokens if first else 0)
                self._start(replica, request, prompt, request.branches.popleft())
                first = False
        if request.open == 0 and not request.branches:
            self.done.append((now, request))
            self._send(request.client, now)

    # -- the report -------------------------------------------------------------------------

    def _result(self, seconds: float, warmup_s: float) -> ScaleResult:
        measured = [(t, r) for t, r in self.done if r.sent_s >= warmup_s]
        window = seconds - warmup_s
        latency = {}
        # By how each was answered, and by what was asked (the load test's "sot" and "plain").
        kinds = {"normal": lambda r: not r.sot, "sot": lambda r: r.sot,
                 "asked_sot": lambda r: r.asked_sot, "others": lambda r: not r.asked_sot}  # fmt: skip
        for kind, keep in kinds.items():
            values = [t - r.sent_s for t, r in measured if keep(r)]
            if values:  # percentiles as the load test reports its own, to compare with it
                latency[kind] = percentiles(values)
        asked = [r for _, r in measured if r.asked_sot]
        chosen = (sum(r.sot for r in asked) / len(asked)) if asked and self.w.sot_mode == "auto" else None
        return ScaleResult(self.d.replicas, self.w.clients, self.d.policy, seconds, len(measured),
                           sum(r.tokens for _, r in measured) / window, len(measured) / window,
                           latency, None if chosen is None else round(chosen, 3))  # fmt: skip



# -- the command line: `python -m sglang_specsot.bench scale-sim` ------------------------------


def costs_from_report(report: dict) -> RowCosts:
    """The curve in a replica's /server_info (the whole reply, or its `specsot_row_costs`)."""
    states = report.get("internal_states")
    if states:
        report = states[0].get("specsot_row_costs") or {}
    try:
        return RowCosts(tuple(report["probe_rows"]), tuple(float(m) for m in report["probe_ms"]),
                        float(report.get("overhead_ms") or 0.0), source="measured replica")  # fmt: skip
    except KeyError as exc:
        raise ValueError(f"no row-cost curve in the costs file (missing {exc}); save a replica's "
                         "/server_info, whose internal_states[0] holds specsot_row_costs") from None  # fmt: skip


def add_arguments(p) -> None:
    p.add_argument("--costs", required=True, help="a replica's /server_info JSON (or its specsot_row_costs)")
    p.add_argument("--replicas", default="1,2,4,8", help="comma-separated replica counts")
    p.add_argument("--clients", type=int, default=32, help="closed-loop clients at load 1 (the measured load test's)")
    p.add_argument("--load", default="1,10", help="comma-separated multiples of --clients, spread over the replicas")
    p.add_argument("--policy", choices=POLICIES, default="least_load")
    p.add_argument("--sot-mode", choices=SOT_MODES, default="auto")
    p.add_argument("--sot-share", type=float, default=0.5)
    p.add_argument("--max-running", type=int, default=32, help="sequences a replica runs at once")
    p.add_argument("--shape", default="{}", help="JSON of AnswerShape fields (sot/latency.py) to override")
    p.add_argument("--length-spread", type=float, default=0.5, help="each answer's lengths x U(1 - s, 1 + s)")
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--out", help="also write the results here as JSON")


# The load test's answers (loadtest.py: plain answers capped at 64 tokens, SoT at 4 points of at
# most 48 and 2 branches at once): lengths a caller replaces with its own through --shape.
DEFAULT_SHAPE = {"normal_tokens": 64, "skeleton_tokens": 40, "branch_tokens": [40, 40, 40, 40], "max_running": 2,
                 "prompt_tokens": 40, "skeleton_prompt_tokens": 400, "branch_prompt_tokens": 120}  # fmt: skip


def run_cli(args) -> int:
    import json

    with open(args.costs) as f:
        costs = costs_from_report(json.load(f))
    fields = {**DEFAULT_SHAPE, **json.loads(args.shape)}
    shape = AnswerShape(**{**fields, "branch_tokens": tuple(fields["branch_tokens"])})
    rows = []
    for replicas in (int(r) for r in args.replicas.split(",")):
        for load in (float(x) for x in args.load.split(",")):
            work = Workload(max(1, round(args.clients * load)), shape, args.sot_share, args.sot_mode, args.length_spread)
            deployment = Deployment(replicas, costs, args.policy, args.max_running)
            result = simulate(deployment, work, seconds=args.seconds, warmup_s=args.seconds / 10)
            rows.append({"load": load, **result.info()})
            print(_row(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"costs": costs.info(), "shape": shape.info(), "policy": args.policy,
                       "sot_mode": args.sot_mode, "rows": rows}, f, indent=1)  # fmt: skip
    return 0


def _row(r: dict) -> str:
    lat = "; ".join(f"{k} p50 {v['p50']:.1f}s p95 {v['p95']:.1f}s (n={v['n']})" for k, v in r["latency"].items())
    chosen = "" if r["sot_chosen"] is None else f", SoT chosen {r['sot_chosen']:.0%}"
    return (f"replicas {r['replicas']}, load {r['load']:g}x ({r['clients']} clients): {r['requests_per_s']:.2f} req/s, "
            f"{r['tokens_per_s']:.0f} tok/s; {lat}{chosen}")
