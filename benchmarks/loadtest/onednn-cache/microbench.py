"""oneDNN's primitive cache: what a cached primitive holds and what rebuilding one costs.

bf16 linears of SmolLM2-135M's ("smol") or Qwen2.5-Coder-1.5B's ("q15") shapes over 111 row
counts (decode/verify batches 1-64 and one-off prefill lengths), each shape once per sweep:
with a capacity below the 444 primitives a sweep needs, every call rebuilds its primitive.
Run (2026-11-24, results-2026-11-24.jsonl beside this file, 2-core Intel Xeon, avx512_bf16):

    for rep in 1 2; do for m in smol q15; do for c in 1024 256 64 16; do
      ONEDNN_PRIMITIVE_CACHE_CAPACITY=$c .venv/bin/python benchmarks/loadtest/onednn-cache/microbench.py $m
    done; done; done
"""
import os, sys, time, json
import torch
torch.manual_seed(0); torch.set_num_threads(2)
model = sys.argv[1]
H, I, KV = {"smol": (576, 1536, 192), "q15": (1536, 8960, 256)}[model]
shapes = [(H, H), (KV, H), (I, H), (H, I)]
ws = [torch.randn(o, i, dtype=torch.bfloat16) for o, i in shapes]
# a serving mix: decode/verify row counts 1..64 and one-off prefill lengths
rows = list(range(1, 65)) + list(range(70, 400, 7))
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
def sweep():
    t0 = time.perf_counter(); n = 0
    for r in rows:
        x = torch.randn(r, H, dtype=torch.bfloat16); xi = torch.randn(r, I, dtype=torch.bfloat16)
        for w in ws:
            torch.nn.functional.linear(xi if w.shape[1] == I else x, w); n += 1
    return time.perf_counter() - t0
r0 = rss(); sweep(); sweep()
t = min(sweep() for _ in range(3))
print(json.dumps({"cap": os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024"), "model": model,
                  "sweep_s": round(t, 3), "rss_growth_mb": round(rss() - r0)}))
