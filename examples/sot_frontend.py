"""Answer a Vicuna question with the SoT frontend program on a CPU SGLang server, next to the
same model's normal answer from the same program (mode "off"), and print both with timings.

    .venv/bin/python examples/sot_frontend.py [--question-id 0] [--specsot]

--specsot serves with the SPECSOT speculative algorithm; the answers must not change (greedy).
"""

from __future__ import annotations

import argparse

from sglang_specsot.data import load_questions
from sglang_specsot.launch import ServerProcess
from sglang_specsot.models import fetch as fetch_model
from sglang_specsot.sot import SoTConfig
from sglang_specsot.sot.runner import SoTAnswer, SoTOptions

MODEL = "smollm2-135m"
QUESTION_ID = 0
SERVER_ARGS = ["--device", "cpu", "--attention-backend", "specsot_cpu", "--dtype", "float32",
               "--max-total-tokens", "8192", "--sleep-on-idle", "--mem-fraction-static", "0.3"]  # fmt: skip
SPECSOT_ARGS = ["--speculative-algorithm", "SPECSOT", "--speculative-num-draft-tokens", "6"]
MAX_NEW_TOKENS = 256  # the whole answer's cap; each point aims at its share of it (sot/budget.py)
CONFIG = SoTConfig(skeleton_max_tokens=64, max_points=5, max_running=3, router_min_answer_tokens=1)
TEMPERATURE = 0.0  # greedy: the run is deterministic


def fetch(name: str) -> str:
    """The fetched checkpoint directory of `name` (downloads and converts it the first time)."""
    return str(fetch_model(name))


def question(qid: int) -> str:
    rows = load_questions("vicuna80")
    return next(row["question"] for row in rows if row["id"] == qid)


def show(title: str, answer: SoTAnswer) -> None:
    print(f"\n=== {title}: path {answer.path} ({answer.reason}), {answer.seconds:.1f} s, "
          f"{answer.completion_tokens} tokens generated ===")  # fmt: skip
    if answer.skeleton is not None:
        sk = answer.skeleton
        print(f"skeleton ({sk.seconds:.1f} s, {sk.result.completion_tokens} tokens, {sk.parse.outcome}):")
        print("  " + sk.text.replace("\n", "\n  "))
    if answer.branches is not None:
        br = answer.branches
        print(f"branches: {len(br.results)} in {br.seconds:.1f} s, at most {br.plan.max_running} at once, "
              f"start order {list(br.start_order)}")  # fmt: skip
        for b in br.results:
            print(f"  {b.index + 1}. {b.point!r}: {b.result.completion_tokens} tokens, "
                  f"{b.started:.1f}-{b.finished:.1f} s, {b.result.finish_reason}")  # fmt: skip
    print("\n" + answer.answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--question-id", type=int, default=QUESTION_ID)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--specsot", action="store_true", help="serve with --speculative-algorithm SPECSOT")
    args = parser.parse_args()

    from sglang_specsot.frontend import SoTEndpoint, answer_question, chat_renderer

    model_path = fetch(args.model)
    text = question(args.question_id)
    server_args = SERVER_ARGS + (SPECSOT_ARGS if args.specsot else [])
    print(f"starting SGLang on CPU: {args.model}{' with SPECSOT' if args.specsot else ''}", flush=True)
    with ServerProcess(model_path, server_args) as server:
        endpoint, render = SoTEndpoint(server.base_url), chat_renderer(model_path)
        print(f"question {args.question_id}: {text}", flush=True)
        normal = answer_question(endpoint, text, render, SoTOptions("off", CONFIG, MAX_NEW_TOKENS), temperature=TEMPERATURE)
        sot = answer_question(endpoint, text, render, SoTOptions("auto", CONFIG, MAX_NEW_TOKENS), temperature=TEMPERATURE)
    show("normal answer (baseline)", normal)
    show("Skeleton-of-Thought", sot)
    print(f"\nend to end: SoT {sot.seconds:.1f} s vs normal {normal.seconds:.1f} s "
          f"({normal.seconds / sot.seconds:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
