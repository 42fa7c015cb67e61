"""`python -m sglang_specsot.bench dp-placement`: keep vs spread, side by side on one server.

One SoT server with `--dp-size N` and SGLANG_SPECSOT_DP_BRANCHES=spread answers every question
both ways, interleaved (the order alternates per repeat), the radix cache flushed before each
round: "spread" as configured, "keep" by the client's own `routed_dp_rank` (the answer's home
taken in turn, as the server's keep does), which keeps the whole answer on that rank. With
`--concurrency c`, c answers of one placement run at once. Each answer is appended to
`results.jsonl` in --out as it ends (a rerun resumes), and the summary prints per concurrency
the median latency ratio keep / spread (above 1: spread is faster) beside the latency model's
prediction from the server's own row-cost curve (sot/placement_cost.py), with both placements'
mean completion tokens, so a speed-up bought by a different answer shows.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from sglang_specsot.bench.cells import flush_cache
from sglang_specsot.bench.scale_sim import costs_from_report
from sglang_specsot.gateway import http
from sglang_specsot.sot.latency import AnswerShape, RowCosts
from sglang_specsot.sot.placement_cost import placement_cost

PLACEMENTS = ("keep", "spread")
CONFIG = {"max_points": 4, "max_running": 4, "router_min_answer_tokens": 1}


def answer(url: str, model: str, question: str, max_tokens: int, rank: int | None) -> dict:
    """One SoT answer's latency, tokens and the ranks its branches ran on."""
    body = {"model": model, "messages": [{"role": "user", "content": question}], "temperature": 0,
            "max_tokens": max_tokens, "specsot": {"mode": "on", "config": CONFIG}}  # fmt: skip
    if rank is not None:
        body["routed_dp_rank"] = rank
    started = time.monotonic()
    reply = http(f"{url}/v1/chat/completions", body, timeout=1800)
    seconds = time.monotonic() - started
    meta = (reply.get("metadata") or {}).get("specsot") or {}
    items = (meta.get("branches") or {}).get("items") or []
    return {"seconds": round(seconds, 3), "tokens": reply["usage"]["completion_tokens"], "path": meta.get("path"),
            "ranks": sorted({i.get("dp_rank") for i in items if i.get("dp_rank") is not None}),
            "uncached": [i["prompt_tokens"] - i["cached_tokens"] for i in items],
            "branch_tokens": [i["completion_tokens"] for i in items],
            "branch_prompt": min((i["prompt_tokens"] for i in items), default=0)}  # fmt: skip


def run_round(url: str, model: str, questions: list[str], placement: str, ranks: int, args) -> list[dict]:
    """Every question once in `placement`, `args.concurrency` at a time, the cache flushed first."""
    flush_cache(url, 60.0)
    rows: list[dict] = []
    pending = list(enumerate(questions))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                index, question = pending.pop(0)
            rank = index % ranks if placement == "keep" else None
            row = answer(url, model, question, args.max_tokens, rank)
            with lock:
                rows.append({"question": index, "placement": placement, **row})

    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return rows


def summary(rows: list[dict], costs: RowCosts | None = None, ranks: int = 2) -> str:
    """Per concurrency: median keep / spread latency ratio over questions paired by repeat, and
    beside it the latency model's (sot/placement_cost.py) from the server's curve, each spread
    answer's measured branches priced with the other answers running at once."""
    lines = ["| concurrency | answers per placement | keep / spread latency (median) | predicted (median) "
             "| tokens keep / spread | spread ranks |", "|---|---|---|---|---|---|"]  # fmt: skip
    for c in sorted({r["concurrency"] for r in rows}):
        at = [r for r in rows if r["concurrency"] == c]
        pairs = {}
        for r in at:
            pairs.setdefault((r["repeat"], r["question"]), {})[r["placement"]] = r
        ratios = [p["keep"]["seconds"] / p["spread"]["seconds"] for p in pairs.values() if len(p) == 2]
        tokens = {pl: statistics.mean(r["tokens"] for r in at if r["placement"] == pl) for pl in PLACEMENTS}
        spread = [r for r in at if r["placement"] == "spread"]
        spread_ranks = statistics.mean(len(r["ranks"]) for r in spread)
        predicted = [_predicted(costs, r, ranks, c - 1) for r in spread if costs and r.get("branch_tokens")]
        model = f"{statistics.median(predicted):.2f}x" if predicted else "-"
        lines.append(f"| {c} | {len(ratios)} | {statistics.median(ratios):.2f}x | {model} | {tokens['keep']:.0f} / "
                     f"{tokens['spread']:.0f} | {spread_ranks:.1f} |")  # fmt: skip
    return "\n".join(lines)


def _predicted(costs: RowCosts, row: dict, ranks: int, shared: int) -> float:
    branches = tuple(max(1, t) for t in row["branch_tokens"])
    shape = AnswerShape(sum(branches), 0, branches, CONFIG["max_running"], branch_prompt_tokens=row["branch_prompt"])
    return placement_cost(costs, shape, ranks, shared).ratio


def run_cli(args) -> int:
    from sglang_specsot.data import load_questions

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    done = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    rows = load_questions(args.questions)
    questions = [r["question"] for r in rows if r.get("sot_suitable", True)][: args.suitable]
    with ExitStack() as stack:
        url = args.url or _start(stack, args)
        model = http(f"{url}/v1/models")["data"][0]["id"]
        ranks = args.dp_size
        for concurrency in args.concurrency_levels:
            for repeat in range(args.repeats):
                order = PLACEMENTS if repeat % 2 == 0 else PLACEMENTS[::-1]
                for placement in order:
                    if any(r["concurrency"] == concurrency and r["repeat"] == repeat and r["placement"] == placement
                           for r in done):  # fmt: skip
                        continue
                    args.concurrency = concurrency
                    new = [r | {"concurrency": concurrency, "repeat": repeat}
                           for r in run_round(url, model, questions, placement, ranks, args)]  # fmt: skip
                    with open(results, "a") as f:
                        f.writelines(json.dumps(r) + "\n" for r in new)
                    done += new
                    print(f"concurrency {concurrency}, repeat {repeat}, {placement}: "
                          f"{statistics.median(r['seconds'] for r in new):.1f} s median", flush=True)  # fmt: skip
        info = http(f"{url}/server_info", timeout=60)
        (out / "server_info.json").write_text(json.dumps({"internal_states": info.get("internal_states")}) + "\n")
    table = summary(done, costs_from_report(info), ranks)
    (out / "summary.md").write_text(table + "\n")
    print(table)
    return 0


def _start(stack: ExitStack, args) -> str:
    from sglang_specsot.bench.e2e import resolve_model
    from sglang_specsot.gateway import core_sets
    from sglang_specsot.launch import ServerProcess

    path = resolve_model(args.target, "target")
    env = {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(core_sets(args.dp_size)), "SGLANG_SPECSOT_DP_BRANCHES": "spread"}
    server_args = ["--device", "cpu", "--attention-backend", "specsot_cpu", "--max-total-tokens", "16384",
                   "--mem-fraction-static", "0.3", "--sleep-on-idle", "--enable-custom-logit-processor",
                   "--dp-size", str(args.dp_size)]  # fmt: skip
    process = stack.enter_context(ServerProcess(path, server_args, env, log_path=Path(args.out) / "server.log"))
    return process.base_url


def add_arguments(p) -> None:
    p.add_argument("--target", default="qwen2.5-coder-0.5b", help="model to fetch and serve (without --url)")
    p.add_argument("--url", help="a running server launched with --dp-size and SGLANG_SPECSOT_DP_BRANCHES=spread")
    p.add_argument("--dp-size", type=int, default=2)
    p.add_argument("--questions", default=str(Path(__file__).resolve().parents[1] / "data" / "router_holdout.jsonl"))
    p.add_argument("--suitable", type=int, default=4, help="the first N SoT-suitable questions")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--concurrency-levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--out", required=True, help="directory for results.jsonl (resumable) and summary.md")
