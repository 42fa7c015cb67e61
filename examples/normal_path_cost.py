"""What an answer costs on each request path of one server, measured side by side.

Mode `auto` answers many questions normally: where the router or the latency model steps aside,
the chat hook hands the request to SGLang's own chat route after its decision (about 30 ms), so
that answer must cost what plain decoding costs. This script asks one question on one plain
server through each path, interleaved, the order rotated each round, the cache flushed before
each answer, and appends one JSON line per answer:

    python examples/normal_path_cost.py --model qwen2.5-coder-1.5b --max-tokens 512 --rounds 3 \
        --paths generate,chat-auto --out results.jsonl

Paths: `generate` (SGLang's /generate, not streamed: what the end-to-end benchmark's plain
cell sends), `generate-stream` (the same, streamed), `chat-off` (/v1/chat/completions with
`specsot.mode` "off": SGLang's own chat route), `chat-auto` (mode "auto": the router, the
latency model, then SGLang's chat route where it steps aside). A `chat-auto` line records
the path it took; one that took SoT measures something else and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.request
from pathlib import Path

from sglang_specsot.bench.cells import flush_cache
from sglang_specsot.bench.runner import COMMON, MEM_FRACTION, rotated
from sglang_specsot.data import load_questions
from sglang_specsot.launch import ServerProcess
from sglang_specsot.models import fetch as fetch_model
from sglang_specsot.sot.prompts import normal_messages

SERVER_ARGS = COMMON + ["--mem-fraction-static", MEM_FRACTION]  # the end-to-end benchmark's plain server
PATHS = ("generate", "generate-stream", "chat-off", "chat-auto")


def post(url: str, body: dict, stream: bool = False) -> tuple[float, dict]:
    """Seconds until the whole answer arrived, and the reply (for a stream: its chunk count)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=3600) as reply:
        if stream:
            chunks = sum(1 for line in reply if line.startswith(b"data:") and b"[DONE]" not in line)
            return time.perf_counter() - started, {"chunks": chunks}
        out = json.loads(reply.read())
    return time.perf_counter() - started, out


def requests_for(base: str, prompt: str, messages: list[dict], max_tokens: int) -> dict:
    sampling = {"temperature": 0, "max_new_tokens": max_tokens}
    chat = {"model": "default", "messages": messages, "temperature": 0, "max_tokens": max_tokens}
    return {
        "generate": lambda: post(base + "/generate", {"text": prompt, "sampling_params": sampling}),
        "generate-stream": lambda: post(base + "/generate", {"text": prompt, "stream": True,
                                                             "sampling_params": sampling}, stream=True),
        "chat-off": lambda: post(base + "/v1/chat/completions", {**chat, "specsot": {"mode": "off"}}),
        "chat-auto": lambda: post(base + "/v1/chat/completions", {**chat, "specsot": {"mode": "auto"}}),
    }  # fmt: skip


def completion_tokens(out: dict) -> int | None:
    return (out.get("meta_info") or {}).get("completion_tokens") or (out.get("usage") or {}).get("completion_tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="registry name (python -m sglang_specsot.models list)")
    parser.add_argument("--questions", default="sglang_specsot/data/router_holdout.jsonl")
    parser.add_argument("--question", type=int, default=0, help="which SoT-suitable question of the set")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paths", default="generate,chat-auto", help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", required=True, help="JSONL file the answers are appended to")
    args = parser.parse_args()
    paths = args.paths.split(",")
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        parser.error(f"--paths: unknown {unknown}; choose from {', '.join(PATHS)}")
    suitable = [row for row in load_questions(Path(args.questions)) if row["sot_suitable"]]
    question = suitable[args.question]["question"]
    model = str(fetch_model(args.model))
    out = Path(args.out)
    with ServerProcess(model, SERVER_ARGS + ["--dtype", args.dtype], log_path=out.with_suffix(".server.log")) as server:
        from sglang_specsot.frontend import chat_renderer  # imports sglang: after the server is up

        messages = normal_messages(question, None)
        prompt = chat_renderer(model)(messages)  # as the end-to-end benchmark renders its plain prompts
        cells = requests_for(server.base_url, prompt, messages, args.max_tokens)
        post(server.base_url + "/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 8}})  # warm-up
        for round_ in range(args.rounds):
            for name in rotated(paths, round_):
                flush_cache(server.base_url, 60)
                seconds, reply = cells[name]()
                record = {"round": round_, "path": name, "s": round(seconds, 2), "tokens": completion_tokens(reply),
                          "chunks": reply.get("chunks"), "max_tokens": args.max_tokens,
                          "took": ((reply.get("metadata") or {}).get("specsot") or {}).get("path"),
                          "load": os.getloadavg()[0]}  # fmt: skip
                print(json.dumps(record), flush=True)
                with out.open("a") as f:
                    f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
