"""Plain decoding on each CPU code path of one machine, measured side by side.

What a decode step costs on a CPU depends on the kernels torch picks there, and the fastest is
not always the native one: on the AVX-512 EPYC, bf16 products with the weights as loaded ran a
row slower than the same machine forced onto its AVX2 code path. The CPU runtime packs bf16
weights in oneDNN's layout where a start-up timing measures it faster (cpu/packed_linear.py);
this script checks that plain decoding with that choice is the fastest there is. It starts one
plain server per path, all at once, then asks each in turn (the order rotated each round, the
cache flushed before each answer) for `--tokens` tokens with `ignore_eos`, at 1 row and at
`--rows` rows (that many requests at once, as an SoT answer's branches), and appends one JSON
line per answer:

    python examples/cpu_paths.py --model qwen2.5-coder-1.5b --tokens 64 --rows 5 --rounds 3 \
        --out results.jsonl

Paths: `packed` (the default runtime), `loaded` (SGLANG_SPECSOT_PACKED_LINEAR=off: the weights
as loaded), `avx2` (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2: the AVX2 code path, on
which oneDNN has no bf16 kernel and the runtime packs nothing). The summary gives each path's
median milliseconds per step and its ratio to the fastest path at each row count.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import statistics
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from sglang_specsot.bench.cells import flush_cache
from sglang_specsot.bench.runner import COMMON, MEM_FRACTION, rotated
from sglang_specsot.launch import ServerProcess
from sglang_specsot.models import fetch as fetch_model

PATHS = {
    "packed": {},
    "loaded": {"SGLANG_SPECSOT_PACKED_LINEAR": "off"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
# As the end-to-end benchmark's servers: each may claim most of the memory free when it starts,
# its weights included (SGLang's fraction counts them), since --max-total-tokens caps its KV pool.
SERVER_ARGS = COMMON + ["--mem-fraction-static", MEM_FRACTION]
PROMPT = "Write a long essay about the history of computing, request {i}."


def generate(base: str, i: int, tokens: int) -> None:
    body = {"text": PROMPT.format(i=i), "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0}}
    request = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=3600) as reply:
        reply.read()


def timed(base: str, rows: int, tokens: int) -> float:
    """Seconds for `rows` answers of `tokens` tokens asked at once."""
    started = time.perf_counter()
    with cf.ThreadPoolExecutor(rows) as pool:
        list(pool.map(lambda i: generate(base, i, tokens), range(rows)))
    return time.perf_counter() - started


def summary(records: list[dict]) -> list[str]:
    """Median ms per step of each path at each row count, and its ratio to the fastest there."""
    lines = []
    for rows in sorted({r["rows"] for r in records}):
        ms = {p: statistics.median(r["ms_per_step"] for r in records if r["path"] == p and r["rows"] == rows)
              for p in sorted({r["path"] for r in records if r["rows"] == rows})}  # fmt: skip
        best = min(ms.values())
        lines.append(f"{rows} row(s): " + ", ".join(f"{p} {v:.1f} ms/step ({v / best:.2f}x the fastest)" for p, v in ms.items()))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="registry name (python -m sglang_specsot.models list)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rows", type=int, default=5, help="the row count measured beside 1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", required=True, help="JSONL file the answers are appended to")
    args = parser.parse_args()
    paths = args.paths.split(",")
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        parser.error(f"--paths: unknown {unknown}; choose from {', '.join(PATHS)}")
    model, out = str(fetch_model(args.model)), Path(args.out)
    with ExitStack() as stack:
        servers = {}
        for path in paths:  # one at a time: each start-up times its kernels on an idle machine
            log = out.with_name(f"{out.stem}.{path}.server.log")
            servers[path] = stack.enter_context(
                ServerProcess(model, SERVER_ARGS + ["--dtype", args.dtype], log_path=log, env=PATHS[path])
            )
        for base in (s.base_url for s in servers.values()):
            generate(base, -1, 8)  # warm-up
        records = []
        for round_ in range(args.rounds):
            for rows in (1, args.rows):
                for path in rotated(paths, round_):
                    flush_cache(servers[path].base_url, 60)
                    seconds = timed(servers[path].base_url, rows, args.tokens)
                    record = {"round": round_, "path": path, "rows": rows, "tokens": args.tokens, "s": round(seconds, 2),
                              "ms_per_step": round(seconds * 1e3 / args.tokens, 1), "load": os.getloadavg()[0]}  # fmt: skip
                    records.append(record)
                    print(json.dumps(record), flush=True)
                    with out.open("a") as f:
                        f.write(json.dumps(record) + "\n")
    print("\n".join(summary(records)))


if __name__ == "__main__":
    main()
