"""Start a CPU SGLang server on a fetched model, ask one question, print the answer and stats.

By default: a SPECSOT server on Qwen2.5-Coder-0.5B-Instruct answering a Vicuna question with server-side
Skeleton-of-Thought (the request opts in with the top-level "specsot" field).

    .venv/bin/python examples/serve_and_ask.py                       # SPECSOT + SoT
    .venv/bin/python examples/serve_and_ask.py --algorithm NGRAM --no-sot
"""

from __future__ import annotations

import argparse
import json
import time

from sglang_specsot.costs.dtype_choice import LOG_MARKER
from sglang_specsot.launch import ServerProcess
from sglang_specsot.models import fetch as fetch_model

DEFAULT_QUESTION = "How can I improve my time management skills?"
ALGORITHM_ARGS = {
    "NONE": [],
    "NGRAM": ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "6"],
    "SPECSOT": ["--speculative-algorithm", "SPECSOT", "--speculative-num-draft-tokens", "6"],
}
# Small-model settings: a short skeleton, three branches running at once; each point aims at
# its share of the expected answer length within the cap (sot/budget.py).
SOT_FIELD = {"mode": "auto", "config": {"skeleton_max_tokens": 64, "max_points": 5, "max_running": 3,
                                        "router_min_answer_tokens": 1}}  # fmt: skip


def fetch(name: str) -> str:
    """The fetched checkpoint directory of `name` (downloads and converts it the first time)."""
    return str(fetch_model(name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--algorithm", default="SPECSOT", choices=sorted(ALGORITHM_ARGS))
    parser.add_argument("--no-sot", action="store_true", help="ask for a normal answer")
    parser.add_argument("--question", default=DEFAULT_QUESTION)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()

    model_path = fetch(args.model)
    server_args = ["--device", "cpu", "--attention-backend", "specsot_cpu",
                   "--max-total-tokens", "8192", "--sleep-on-idle"] + ALGORITHM_ARGS[args.algorithm]  # fmt: skip
    print(f"starting SGLang on CPU: {args.model} ({model_path}), algorithm {args.algorithm}", flush=True)
    with ServerProcess(model_path, server_args) as server:
        print(f"server up at {server.base_url}; asking: {args.question}", flush=True)
        for line in server.log_tail(1000).splitlines():
            if LOG_MARKER in line:  # the dtype the server chose for this CPU, and why
                print(line[line.index(LOG_MARKER):], flush=True)
        t0 = time.perf_counter()
        request = {
            "model": "default", "temperature": 0, "max_tokens": args.max_tokens,
            "messages": [{"role": "user", "content": args.question}],
        }  # fmt: skip
        if not args.no_sot:
            request["specsot"] = SOT_FIELD
        reply = server.post("/v1/chat/completions", request)
        elapsed = time.perf_counter() - t0
        tokens = reply["usage"]["completion_tokens"]
        message = reply["choices"][0]["message"]
        if message.get("reasoning_content"):
            print("\nskeleton:\n" + message["reasoning_content"].strip())
        print("\n" + message["content"].strip() + "\n")
        trace = (reply.get("metadata") or {}).get("specsot")
        if trace:
            print("SoT trace:", json.dumps(trace, indent=None)[:600])
        info = server.get("/server_info")["internal_states"][0]
        accept = info.get("avg_spec_accept_length")
        print(f"{tokens} tokens in {elapsed:.1f} s ({tokens / elapsed:.1f} tok/s)"
              + (f", accept length {accept:.2f}" if accept else ""))  # fmt: skip


if __name__ == "__main__":
    main()
