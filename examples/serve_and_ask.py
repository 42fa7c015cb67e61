"""Start a CPU SGLang server on a fetched model, ask one question, print the answer and stats.

    .venv/bin/python examples/serve_and_ask.py --model smollm2-135m --algorithm NGRAM
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from sglang_specsot.launch import ServerProcess

DEFAULT_QUESTION = "How can I improve my time management skills?"
ALGORITHM_ARGS = {
    "NONE": [],
    "NGRAM": ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "6"],
}


def fetch(name: str) -> str:
    out = subprocess.run([sys.executable, "-m", "sglang_specsot.models", "fetch", name],
                         check=True, stdout=subprocess.PIPE, text=True)  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--algorithm", default="NGRAM", choices=sorted(ALGORITHM_ARGS))
    parser.add_argument("--question", default=DEFAULT_QUESTION)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()

    model_path = fetch(args.model)
    server_args = ["--device", "cpu", "--attention-backend", "specsot_cpu",
                   "--max-total-tokens", "8192", "--sleep-on-idle"] + ALGORITHM_ARGS[args.algorithm]  # fmt: skip
    print(f"starting SGLang on CPU: {args.model} ({model_path}), algorithm {args.algorithm}", flush=True)
    with ServerProcess(model_path, server_args) as server:
        print(f"server up at {server.base_url}; asking: {args.question}", flush=True)
        t0 = time.perf_counter()
        reply = server.post("/v1/chat/completions", {
            "model": "default", "temperature": 0, "max_tokens": args.max_tokens,
            "messages": [{"role": "user", "content": args.question}],
        })  # fmt: skip
        elapsed = time.perf_counter() - t0
        tokens = reply["usage"]["completion_tokens"]
        print("\n" + reply["choices"][0]["message"]["content"].strip() + "\n")
        info = server.get("/server_info")["internal_states"][0]
        accept = info.get("avg_spec_accept_length")
        print(f"{tokens} tokens in {elapsed:.1f} s ({tokens / elapsed:.1f} tok/s)"
              + (f", accept length {accept:.2f}" if accept else ""))  # fmt: skip


if __name__ == "__main__":
    main()
