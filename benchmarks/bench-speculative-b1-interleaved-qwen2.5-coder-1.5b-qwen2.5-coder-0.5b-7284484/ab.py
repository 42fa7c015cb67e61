"""A/B per-verify cost at batch 1: servers given as NAME=ARGS (json), alternated per question."""
import json, sys, time, statistics, os
from transformers import AutoTokenizer
from sglang_specsot.launch import ServerProcess
from sglang_specsot.models import fetch
from sglang_specsot.data import load_questions

target, draft = fetch("qwen2.5-coder-1.5b"), fetch("qwen2.5-coder-0.5b")
COMMON = ["--device", "cpu", "--attention-backend", "specsot_cpu", "--max-total-tokens", "16384",
          "--sleep-on-idle", "--mem-fraction-static", "0.92"]
shape = ["--speculative-draft-model-path", draft, "--speculative-num-steps", "4", "--speculative-eagle-topk", "1"]
CONF = {
  "plain": ([], {}),
  "STANDALONE": (["--speculative-algorithm", "STANDALONE", *shape, "--speculative-num-draft-tokens", "5"], {}),
  "SPECSOT": (["--speculative-algorithm", "SPECSOT", *shape, "--speculative-num-draft-tokens", "8"], {}),
  "SPECSOT-force4": (["--speculative-algorithm", "SPECSOT", *shape, "--speculative-num-draft-tokens", "8",
                      "--speculative-adaptive", "--speculative-adaptive-config", "/tmp/runs/s17/force4.json"], {}),
  "SPECSOT-nodefer": (["--speculative-algorithm", "SPECSOT", *shape, "--speculative-num-draft-tokens", "8",
                      "--speculative-adaptive", "--speculative-adaptive-config", "/tmp/runs/s17/nodefer.json"], {}),
}
json.dump({"1": {"candidate_steps": [4]}}, open("/tmp/runs/s17/force4.json", "w"))
json.dump({"1": {"candidate_steps": [0, 1, 2, 3, 4]}, "specsot": {"defer_draft_extend": False}}, open("/tmp/runs/s17/nodefer.json", "w"))
names = sys.argv[1].split(",")
nq = int(sys.argv[2]); max_new = int(sys.argv[3]); qfile = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
skip = int(sys.argv[5]) if len(sys.argv) > 5 else 0
tok = AutoTokenizer.from_pretrained(target)
rows = [json.loads(l) for l in open(qfile)] if qfile else load_questions()
qs = [r["question"] for r in rows if r.get("sot_suitable", True)][skip:skip + nq]
prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True) for q in qs]
servers = {}
for n in names:
    base, _, tree = n.partition("@")  # NAME@/path/to/worktree: that checkout's sglang_specsot
    a, env = CONF[base]
    env = dict(env, **({"PYTHONPATH": tree} if tree else {}))
    servers[n] = ServerProcess(target, COMMON + a, env=dict(env, **({"SGLANG_SPECSOT_STEP_LOG": f"/tmp/runs/s17/steps-{n.replace('/', '_')}.jsonl"} if n.startswith("SPECSOT") else {})), log_path=__import__("pathlib").Path(f"/tmp/runs/s17/server-{n.replace('/', '_')}.log")).start()
    servers[n].post("/generate", {"text": prompts[0], "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
res = {n: [] for n in names}
try:
    for i, p in enumerate(prompts):
        order = names if i % 2 == 0 else names[::-1]
        for n in order:
            servers[n].post("/flush_cache", {}) if False else None
            t = time.perf_counter()
            o = servers[n].post("/generate", {"text": p, "sampling_params": {"temperature": 0, "max_new_tokens": max_new}})
            dt = time.perf_counter() - t
            m = o["meta_info"]
            res[n].append(dict(q=i, tokens=m["completion_tokens"], s=dt, verify=m.get("spec_verify_ct"), accept=m.get("spec_accept_length"), spent=m.get("spec_cap_length")))
            print(n, res[n][-1], flush=True)
finally:
    for s in servers.values(): s.stop()
for n in names:
    r = res[n]; tok_s = sum(x["tokens"] for x in r) / sum(x["s"] for x in r)
    ms_v = [1e3 * x["s"] / x["verify"] for x in r if x["verify"]]
    print(f"{n:18s} tok/s {tok_s:.2f}  ms/verify {statistics.fmean(ms_v) if ms_v else 0:.0f}  accept {statistics.fmean([x['accept'] or 0 for x in r]):.2f}")
