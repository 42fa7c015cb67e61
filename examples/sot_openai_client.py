"""Ask a CPU SGLang server for a Skeleton-of-Thought answer with the plain OpenAI client: the
request opts in with `extra_body={"specsot": {...}}`; the server runs skeleton -> branches ->
merge and returns one chat completion. Shows the non-streamed reply with its per-phase trace
(`metadata.specsot`), then the same question streamed (skeleton as reasoning_content first,
then whole points in order), then the model's normal answer as the baseline. `--system`
sends a system message first: SoT plans and writes the answer under it.

    .venv/bin/python examples/sot_openai_client.py [--question-id 1] [--system "Always answer in French."]
"""

from __future__ import annotations

import argparse
import time

from openai import OpenAI

from sglang_specsot.data import load_questions
from sglang_specsot.launch import ServerProcess
from sglang_specsot.models import fetch as fetch_model

MODEL = "smollm2-135m"
QUESTION_ID = 1
SERVER_ARGS = ["--device", "cpu", "--attention-backend", "specsot_cpu", "--dtype", "float32",
               "--max-total-tokens", "8192", "--sleep-on-idle", "--mem-fraction-static", "0.3"]  # fmt: skip
MAX_TOKENS = 256
SPECSOT = {"mode": "auto", "config": {"skeleton_max_tokens": 64, "max_points": 5, "max_running": 3,
                                      "router_min_answer_tokens": 1}}  # fmt: skip


def fetch(name: str) -> str:
    """The fetched checkpoint directory of `name` (downloads and converts it the first time)."""
    return str(fetch_model(name))


def question(qid: int) -> str:
    rows = load_questions("vicuna80")
    return next(row["question"] for row in rows if row["id"] == qid)


def ask(client: OpenAI, text: str, system: str | None = None, **kwargs):
    first = [{"role": "system", "content": system}] if system else []
    return client.chat.completions.create(
        model="default", messages=[*first, {"role": "user", "content": text}],
        temperature=0, max_tokens=MAX_TOKENS, **kwargs,
    )  # fmt: skip


def show_reply(reply, seconds: float) -> None:
    message, trace = reply.choices[0].message, (reply.model_extra.get("metadata") or {}).get("specsot")
    print(f"\n=== SoT, not streamed: {seconds:.1f} s, usage {reply.usage.prompt_tokens} prompt + "
          f"{reply.usage.completion_tokens} completion tokens ===")  # fmt: skip
    print(f"path {trace['path']}: {trace['reason']}")
    if "skeleton" in trace:
        sk = trace["skeleton"]
        print(f"skeleton ({sk['seconds']:.1f} s, {sk['completion_tokens']} tokens, {sk['outcome']}): {sk['points']}")
    if "branches" in trace:
        br = trace["branches"]
        print(f"branches: {len(br['items'])} in {br['seconds']:.1f} s, start order {br['start_order']}")
    reasoning = getattr(message, "reasoning_content", None) or (message.model_extra or {}).get("reasoning_content")
    print(f"skeleton (reasoning_content):\n  {reasoning}\n\n{message.content}")


def stream(client: OpenAI, text: str, system: str | None) -> None:
    print("\n=== SoT, streamed ===")
    started, first = time.perf_counter(), {}
    for chunk in ask(client, text, system, stream=True, extra_body={"specsot": SPECSOT}):
        for choice in chunk.choices:
            delta = choice.delta.model_extra or {}
            for kind, piece in (("skeleton", delta.get("reasoning_content")), ("answer", choice.delta.content)):
                if piece:
                    if kind not in first:
                        first[kind] = time.perf_counter() - started
                        print(f"\n[{kind}]\n", end="")
                    print(piece, end="", flush=True)
    print(f"\n[first skeleton text after {first.get('skeleton', 0):.1f} s, first point after "
          f"{first.get('answer', 0):.1f} s, done after {time.perf_counter() - started:.1f} s]")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--question-id", type=int, default=QUESTION_ID)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--system", default=None, help="a system message sent before the question")
    args = parser.parse_args()

    model_path, text = fetch(args.model), question(args.question_id)
    print(f"starting SGLang on CPU: {args.model}", flush=True)
    with ServerProcess(model_path, SERVER_ARGS) as server:
        client = OpenAI(base_url=server.base_url + "/v1", api_key="none")
        print(f"question {args.question_id}: {text}", flush=True)
        started = time.perf_counter()
        reply = ask(client, text, args.system, extra_body={"specsot": SPECSOT})
        show_reply(reply, time.perf_counter() - started)
        stream(client, text, args.system)
        started = time.perf_counter()
        normal = ask(client, text, args.system)  # no "specsot" field: SGLang's own answer
        seconds = time.perf_counter() - started
    print(f"\n=== normal answer (baseline): {seconds:.1f} s, {normal.usage.completion_tokens} tokens ===")
    print(normal.choices[0].message.content)


if __name__ == "__main__":
    main()
