"""What a load test counts: each request's `Outcome`, and the `Report` they tally into
(counts, latency percentiles, tokens, the per-question table)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field


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


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"n": len(values), "p50": round(pick(0.5), 2), "p90": round(pick(0.9), 2),
            "p95": round(pick(0.95), 2), "p99": round(pick(0.99), 2), "max": round(values[-1], 2)}  # fmt: skip


def tally(report: Report, outcomes: list[Outcome]) -> None:
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
