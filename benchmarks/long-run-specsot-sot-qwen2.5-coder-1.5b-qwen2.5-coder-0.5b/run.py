"""One SPECSOT server answering SoT questions one after another for thousands of decode steps:
do losing drafting-run verdicts come back ever more rarely (DraftingRuns' backoff), and what
do their re-measurements cost over a server's life?

The server is the end-to-end benchmark's SpecSoT server (the same flags, bf16, 1.5B target,
0.5B draft), each answer a server-side SoT answer with the same 384-token cap, the cache
flushed before each as the benchmark does. After every answer one line is appended to
`answers.jsonl`: the question, its latency, tokens and accept length, and the server's
`/server_info` SPECSOT state (drafting runs and verdicts, exploring, catch-ups). Re-running
the command skips the questions already answered (a new server then starts cold: the file
says where); `--questions N` sets how many. `--report` prints, from `answers.jsonl`, each
verdict of the "5 branch" key (the batch SoT answers spend most steps in) as it was made:
after which answer, the runs behind it, what they saved, and how long it stays fresh.

    PYTHONPATH=. .venv/bin/python benchmarks/long-run-specsot-sot-qwen2.5-coder-1.5b-qwen2.5-coder-0.5b/run.py \
        --questions 48 --out DIR
    python benchmarks/long-run-specsot-sot-qwen2.5-coder-1.5b-qwen2.5-coder-0.5b/run.py --report --out DIR
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path


# Suitable questions nothing in SPECSOT's policy was tuned on, in a fixed order: the held-out
# router sets first, then our training sets (the SoT prompts were tuned on part of router_train).
SETS = ("router_holdout", "router_holdout2", "router_train")
KEEP = ("drafting_runs", "drafting_runs_total", "exploring_steps", "exploring_skipped", "explore_fund",
        "drafting_not_repaid", "draft_extend", "chain_depths", "acceptance_prior_by_role")  # fmt: skip


def questions(n: int) -> list[tuple[str, object]]:
    """The first `n` suitable questions of SETS, each keyed "set:id" (what a resumed run skips)."""
    from sglang_specsot.bench.e2e import pick_questions
    from sglang_specsot.data import DATA_DIR, load_questions

    out = [(f"{name}:{q.id}", q) for name in SETS
           for q in pick_questions(load_questions(DATA_DIR / f"{name}.jsonl"), None, None, 0)]  # fmt: skip
    return out[:n]


def report(path: Path, key: str = "5 branch") -> None:
    """One line per new verdict of `key`, then the run's totals."""
    rows = [json.loads(line) for line in open(path)]
    print("| after answer | runs so far | saved by them, ms | verdict: mean steps / saved ms a run | fresh for steps |")
    print("|---|---|---|---|---|")
    seen = None
    for r in rows:
        total = (r["state"]["drafting_runs_total"] or {}).get(key) or {}
        verdict = (r["state"]["drafting_runs"] or {}).get(key)
        if verdict and total.get("runs") != seen:
            seen = total.get("runs")
            print(f"| {r['server_answer']} | {seen} | {total['saved_ms']:.0f} | {verdict['steps']} / {verdict['saved_ms']} |"
                  f" {verdict['fresh_for']} |")
    last = rows[-1]["state"]
    seconds = sum(r["latency"] for r in rows)
    lost = sum(v["saved_ms"] + v["exploring_saved_ms"] for v in (last["drafting_runs_total"] or {}).values())
    print(f"\n{len(rows)} answers, {seconds:.0f} s; every drafting run of the server's life saved {lost:.0f} ms"
          f" ({100 * lost / 1000 / seconds:+.2f}% of the answers' time); by key: {json.dumps(last['drafting_runs_total'])}")
    accept = [r["accept_length"] for r in rows if r["accept_length"]]
    print(f"accept length: mean {sum(accept) / len(accept):.3f}; exploring steps {last['exploring_steps']};"
          f" catch-up forwards {(last['draft_extend'] or {}).get('catch_up_forwards')}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=384)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--report", action="store_true", help="print the verdicts and totals of a run, start nothing")
    a = p.parse_args()
    if a.report:
        report(a.out / "answers.jsonl")
        return
    a.out.mkdir(parents=True, exist_ok=True)
    log = a.out / "answers.jsonl"
    done = {json.loads(line)["key"] for line in open(log)} if log.exists() else set()
    todo = [(k, q) for k, q in questions(a.questions) if k not in done]
    if todo:
        # Stopped with SIGTERM (pkill, the end of a session): unwind, so the server stops too.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        serve(todo, a.max_tokens, log)


def serve(todo: list, max_tokens: int, log: Path) -> None:
    """Start the SpecSoT server, ask every question in `todo`, append a line to `log` after each."""
    from sglang_specsot.bench.cells import Settings, Target, run_cell
    from sglang_specsot.bench.configs import SERVER_SOT, CellConfig, servers
    from sglang_specsot.bench.e2e import resolve_model
    from sglang_specsot.bench.runner import WARM_UP_QUESTION, server_args, skeleton_constrained
    from sglang_specsot.launch import ServerProcess

    target_path, draft_path = resolve_model("qwen2.5-coder-1.5b", "target"), resolve_model("qwen2.5-coder-0.5b", "draft")
    spec = servers(draft_path)["specsot"]
    args = server_args(spec, "bfloat16")
    cfg = CellConfig("SpecSoT-server", "specsot", SERVER_SOT, "on")
    settings = Settings(max_tokens=max_tokens, timeout=900.0)
    with ServerProcess(target_path, args, dict(spec.env),
                       log_path=log.parent / "server.log", startup_timeout=900.0) as server:  # fmt: skip
        from sglang_specsot.frontend import chat_renderer

        target = Target(server.base_url, chat_renderer(target_path), lambda: None,
                        constrain_skeleton=skeleton_constrained(spec))
        run_cell(cfg, WARM_UP_QUESTION, target, settings)  # as the benchmark's --warm-up: untimed
        started = time.time()
        for n, (key, q) in enumerate(todo):
            cell = run_cell(cfg, q, target, settings)
            state = (server.get("/server_info", timeout=30.0).get("internal_states") or [{}])[0].get("specsot", {})
            row = {"key": key, "server_answer": n + 1, "server_started": started, "status": cell.status,
                   "reason": cell.reason, "latency": cell.latency, "output_tokens": cell.output_tokens,
                   "accept_length": cell.accept_length, "points": cell.points, "skeleton_s": cell.skeleton_seconds,
                   "commit": cell.commit,
                   "state": {k: state.get(k) for k in KEEP}}  # fmt: skip
            with open(log, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(key, cell.status, round(cell.latency or 0, 1), cell.accept_length, flush=True)


if __name__ == "__main__":
    main()
