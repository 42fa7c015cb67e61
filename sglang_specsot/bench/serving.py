"""SGLang's own bench_serving on the benchmark's questions, per server, merged into one table.

The questions become bench_serving's `custom` dataset (a JSONL of two-turn conversations; the
assistant turn only sets the output length, which --sharegpt-output-len fixes anyway). Each
configuration starts its server alone, runs `python -m sglang.benchmark.serving` with the
`sglang-oai-chat` backend at each concurrency, and the JSON line it appends is tagged and merged
into serving.md; a re-run skips the (configuration, concurrency) pairs that have a result.
SoT goes through `--extra-request-body '{"specsot": {"mode": "on"}}'`. With `--replicas N` each
configuration runs as N servers on their own cores behind SGLang's gateway (`smg`, `--policy`),
and bench_serving sends to the gateway.

What the numbers mean for a SoT response: bench_serving counts streamed `reasoning_content`
like content, and server-side SoT streams the skeleton first as reasoning_content, then
whole points. So TTFT is the time to the skeleton's first token (not to the answer's), ITL
mixes skeleton tokens with the gaps between whole points, and TPOT = (E2E - TTFT) / (output
tokens - 1) spreads the branches' parallel tokens over one stream: it is not a per-token
cost. E2E (the complete answer) is the measure that compares SoT with normal decoding.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sglang_specsot.bench.cells import flush_cache
from sglang_specsot.bench.provenance import record_invocation
from sglang_specsot.bench.configs import servers
from sglang_specsot.gateway import served

# name: (server, extra request body)
CONFIGS = {
    "plain": ("plain", {}),
    "NGRAM": ("ngram", {}),
    "STANDALONE": ("standalone", {}),
    "SPECSOT": ("specsot", {}),
    "SoT": ("plain", {"specsot": {"mode": "on"}}),
    "SpecSoT": ("specsot", {"specsot": {"mode": "on"}}),
    "SpecSoT-router": ("specsot", {"specsot": {"mode": "auto"}}),
    "SoT-router": ("plain", {"specsot": {"mode": "auto"}}),
}
FIELDS = ["median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
          "median_e2e_latency_ms", "p99_e2e_latency_ms", "output_throughput", "accept_length"]  # fmt: skip


def add_arguments(p) -> None:
    p.add_argument("--target", required=True)
    p.add_argument("--draft", default=None, help="without it STANDALONE, SPECSOT run SoT-context drafting only")
    p.add_argument("--questions", default="vicuna80")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--suitable", type=int, default=None)
    p.add_argument("--unsuitable", type=int, default=None)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--max-tokens", type=int, default=384)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per bench_serving run")
    p.add_argument("--replicas", type=int, default=1,
                   help="run each configuration as this many servers, each on its own cores, behind SGLang's gateway (smg)")
    p.add_argument("--policy", default="cache_aware", help="the gateway's routing policy, with --replicas > 1")
    p.add_argument("--out", default=None, help="directory (default benchmarks/serving-TARGET[-DRAFT])")


def write_dataset(questions, path: Path, max_tokens: int) -> Path:
    with path.open("w") as f:
        for q in questions:
            f.write(json.dumps({"conversations": [{"role": "user", "content": q.text},
                                                  {"role": "assistant", "content": "x " * max_tokens}]}) + "\n")  # fmt: skip
    return path


def bench_command(url: str, model: str, dataset: Path, n: int, concurrency: int, max_tokens: int,
                  body: dict, output: Path) -> list[str]:  # fmt: skip
    cmd = [sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang-oai-chat", "--base-url", url,
           "--model", model, "--tokenizer", model, "--dataset-name", "custom", "--dataset-path", str(dataset),
           "--num-prompts", str(n), "--max-concurrency", str(concurrency), "--sharegpt-output-len", str(max_tokens),
           "--seed", "0", "--output-file", str(output),
           # Real answers, as in the e2e benchmark: bench_serving's default ignore_eos would
           # pad every normal answer to the cap with text past its end.
           "--disable-ignore-eos"]  # fmt: skip
    return cmd + (["--extra-request-body", json.dumps(body)] if body else [])


def failures(merged: Path) -> list[dict]:
    """The last error of each (config, concurrency) that has no result, so a failed run shows
    in serving.md and not only in serving.jsonl."""
    done, errors = finished(merged), {}
    measured = {config for config, _ in done}
    for r in _rows(merged):
        key = (r["config"], r.get("concurrency"))
        # A server that did not start has no concurrency: it failed every run of its config.
        superseded = key in done if key[1] is not None else key[0] in measured
        if "error" in r and not superseded:
            errors[key] = r
    return list(errors.values())


def failure_lines(rows: list[dict]) -> str:
    if not rows:
        return ""
    lines = ["", "Failed runs (no result):", ""]
    lines += [f"- {r['config']}" + (f" at concurrency {r['concurrency']}" if r.get("concurrency") else "")
              + f": {r['error'].strip()[:300]}" for r in rows]  # fmt: skip
    return "\n".join(lines) + "\n"


def merge(rows: list[dict]) -> str:
    """One markdown table of the tagged bench_serving result lines."""
    head = ["config", "concurrency", "completed", *FIELDS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        vals = [row.get(k) for k in head]
        lines.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v if v is not None else "-") for v in vals) + " |")
    return "\n".join(lines) + "\n"


def main(args) -> int:
    from sglang_specsot.bench.e2e import check_models, pick_questions, resolve_model
    from sglang_specsot.bench.runner import COMMON, MEM_FRACTION
    from sglang_specsot.data import load_questions

    names = args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    questions = pick_questions(load_questions(args.questions), args.limit, args.suitable, args.unsuitable)
    check_models(args.target, args.draft)  # the draft too, before a download of minutes for the target
    target = resolve_model(args.target, "target")
    draft = resolve_model(args.draft, "draft") if args.draft else None
    specs = servers(draft)
    out = Path(args.out or f"benchmarks/serving-{Path(args.target).name}" + (f"-{Path(args.draft).name}" if args.draft else ""))
    (out / "logs").mkdir(parents=True, exist_ok=True)
    record_invocation(out)
    dataset = write_dataset(questions, out / "questions.jsonl", args.max_tokens)
    merged = out / "serving.jsonl"
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    for name in names:
        todo = [c for c in concurrencies if (name, c) not in finished(merged)]
        if not todo:
            continue  # resumed: measured in an earlier run of this command
        server_name, body = CONFIGS[name]
        server_name = server_name if server_name in specs else "specsot-ctx"  # no draft: context drafting
        args_ = COMMON + ["--mem-fraction-static", MEM_FRACTION, "--dtype", args.dtype] + list(specs[server_name].args)
        try:
            env = dict(specs[server_name].env)
            with served(target, args_, env, args.replicas, args.policy, out / "logs", f"serving-{name}") as (url, processes):
                replicas = [p.base_url for p in processes]
                for c in todo:
                    _one(url, replicas, target, dataset, len(questions), c, args, body, out, name, merged)
        except (RuntimeError, TimeoutError, OSError) as exc:
            _append(merged, {"config": name, "error": str(exc).splitlines()[0]})
            print(f"{name}: failed: {str(exc).splitlines()[0]}", flush=True)
    table = merge(latest(merged)) + failure_lines(failures(merged))
    (out / "serving.md").write_text(table)
    print(table)
    return 0


def _rows(merged: Path) -> list[dict]:
    return [json.loads(line) for line in merged.read_text().splitlines() if line.strip()] if merged.exists() else []


def finished(merged: Path) -> set[tuple[str, int]]:
    """(config, concurrency) pairs with a result line, which a re-run skips."""
    return {(r["config"], r["concurrency"]) for r in _rows(merged) if "error" not in r and "concurrency" in r}


def latest(merged: Path) -> list[dict]:
    """The last successful line of each (config, concurrency), in first-measured order."""
    rows: dict[tuple[str, int], dict] = {}
    for r in _rows(merged):
        if "error" not in r and "concurrency" in r:
            rows[(r["config"], r["concurrency"])] = r
    return list(rows.values())


def _one(url, replicas, target, dataset, n, c, args, body, out: Path, name: str, merged: Path) -> None:
    raw = out / f"raw-{name}-c{c}.jsonl"
    raw.unlink(missing_ok=True)
    cmd = bench_command(url, target, dataset, n, c, args.max_tokens, body, raw)
    print(f"{name} concurrency {c}: {' '.join(cmd[1:4])} ...", flush=True)
    try:
        for replica in replicas:  # each run starts cold: no prefix or drafter corpus from the last one
            flush_cache(replica, 60.0)
        subprocess.run(cmd, check=True, timeout=args.timeout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        result = json.loads(raw.read_text().splitlines()[-1])
        row = {"config": name, "concurrency": c, **{k: result.get(k) for k in ["completed", *FIELDS]}}
        _append(merged, row | ({"replicas": len(replicas), "policy": args.policy} if len(replicas) > 1 else {}))
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        _append(merged, {"config": name, "concurrency": c, "error": f"{exc} {detail[-300:]}"})


def _append(path: Path, row: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
