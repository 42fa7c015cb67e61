"""One-off: greedy parity, float32, 1.5B target + 0.5B draft (the pair whose drafts pay, so
chains stop by confidence), batch 1 then batches 2-8; prints chain_depths."""
import json, sys
from transformers import AutoTokenizer
from sglang_specsot.launch import ServerProcess
from sglang_specsot.models import fetch
from tests.integration.conftest import cpu_args
from tests.integration.parity import generate, mismatches, parity_prompts, run_batches

target, draft = fetch("qwen2.5-coder-1.5b"), fetch("qwen2.5-coder-0.5b")
prompts = parity_prompts(AutoTokenizer.from_pretrained(target), questions=int(sys.argv[1]))
N = int(sys.argv[2])
args = cpu_args(max_total_tokens=8192, mem_fraction_static=0.9)
def run(server):
    return [r for p in prompts[:6] for r in generate(server, [p], N)] + run_batches(server, prompts[6:], N)
with ServerProcess(target, args, log_path=__import__("pathlib").Path("/tmp/runs/s17/p15-plain.log")) as s:
    plain = [r["output_ids"] for r in run(s)]
spec_args = args + ["--speculative-algorithm", "SPECSOT", "--speculative-draft-model-path", draft,
                    "--speculative-num-steps", "4", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "8"]
with ServerProcess(target, spec_args, log_path=__import__("pathlib").Path("/tmp/runs/s17/p15-spec.log")) as s:
    res = run(s)
    rep = s.get("/server_info")["internal_states"][0]["specsot"]
bad = mismatches(res, plain)
print(json.dumps({"prompts": len(prompts), "max_new": N, "mismatches": bad, "chain_depths": rep.get("chain_depths"),
                  "acceptance_by_depth": rep.get("acceptance_by_depth"), "accept": [round(r["meta_info"].get("spec_accept_length", 0), 2) for r in res]}))
