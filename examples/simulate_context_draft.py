"""Offline accept length of the SoT-context drafter, on recorded greedy decodes.

Greedy verify accepts exactly the longest tree path that equals the true continuation, so
with the target's greedy output recorded once, every drafter change can be scored in seconds
and deterministically, without a server:

    .venv/bin/python examples/simulate_context_draft.py record    # once: plain server, writes DATA
    .venv/bin/python examples/simulate_context_draft.py           # replays DATA: NGRAM vs ContextDrafter
    .venv/bin/python examples/simulate_context_draft.py --set depth_decay=0.7 --rounds 2

The replay follows the SPECSOT worker: a request starts at prefill with its prompt and first
token, every decode step proposes one tree per request of the batch (SoT branches of one group
in lockstep, as the scheduler runs them), then appends what verify accepted plus the bonus
token. Accept length is SGLang's: completion tokens / verify steps, averaged over requests (as
`bench_speculative.py` averages `meta_info.spec_accept_length`). The workloads are the
benchmark's (`bench_speculative.workloads`), in its order (warm-up, Vicuna, branches): its first
BENCH_QUESTIONS questions, then the following ones as a held-out set. The baseline, SGLang's
NGRAM corpus, is replayed in the same run. The real-server benchmark stays the final word.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_speculative import COMMON, suitable_questions, workloads  # noqa: E402  (the benchmark's exact prompts)

from sglang_specsot.speculative.context_draft import ContextDraftConfig, ContextDrafter, DraftTree  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "smollm2_greedy_traces.json"
MODEL = "smollm2-135m"
QUESTIONS = 12  # recorded; the first BENCH_QUESTIONS are the benchmark's, the rest held out
BENCH_QUESTIONS = 4
MAX_NEW_TOKENS = 96
WARMUP_TOKENS = 8  # bench_speculative.py warms every server up with the first Vicuna prompt
NUM_DRAFT_TOKENS = 6  # tree nodes incl. the root, as the benchmark's --speculative-num-draft-tokens


# -- record -----------------------------------------------------------------------------------


def record(out: Path) -> None:
    """Greedy output ids of every workload batch from a plain bf16 server."""
    from transformers import AutoTokenizer

    from sglang_specsot.launch import ServerProcess
    from sglang_specsot.models import fetch

    model = str(fetch(MODEL))
    tokenizer = AutoTokenizer.from_pretrained(model)
    loads = workloads(tokenizer, suitable_questions("vicuna80", QUESTIONS))
    traces: dict[str, list[list[dict]]] = {}
    with ServerProcess(model, COMMON + ["--dtype", "bfloat16"], log_path=Path("/tmp/simulate-record.log")) as server:
        for name, batches in loads.items():
            traces[name] = []
            for i, (prompts, _tag) in enumerate(batches):
                print(f"recording {name} {i + 1}/{len(batches)}", flush=True)
                traces[name].append(_record_batch(server, tokenizer, prompts))
    payload = {"model": MODEL, "dtype": "bfloat16", "max_new_tokens": MAX_NEW_TOKENS,
               "bench_questions": BENCH_QUESTIONS, "workloads": traces}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, separators=(",", ":")))
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB)")


def _record_batch(server, tokenizer, prompts: list[str]) -> list[dict]:
    params = [{"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS} for _ in prompts]
    out = server.post("/generate", {"text": prompts, "sampling_params": params})
    out = out if isinstance(out, list) else [out]
    rows = []
    for prompt, o in zip(prompts, out):
        prompt_ids = tokenizer(prompt)["input_ids"]
        # The server tokenizes the same text; a mismatch would make every replay wrong.
        assert len(prompt_ids) == o["meta_info"]["prompt_tokens"], (len(prompt_ids), o["meta_info"])
        rows.append({"prompt_ids": prompt_ids, "output_ids": o["output_ids"]})
    return rows


# -- replay -----------------------------------------------------------------------------------


def replay_batch(drafter, batch: list[dict], tag: str, group: str | None, timings: list[float]) -> list[float]:
    """Decode one recorded batch in lockstep; returns each request's accept length."""
    rids = [f"{tag}-{i}" for i in range(len(batch))]
    pos = {}  # rid -> output tokens committed (the first comes from prefill)
    for rid, row in zip(rids, batch):
        drafter.start(rid, row["prompt_ids"] + row["output_ids"][:1], group=group)
        pos[rid] = 1
    steps = dict.fromkeys(rids, 0)
    live = [r for r, row in zip(rids, batch) if len(row["output_ids"]) > 1]
    rows = dict(zip(rids, batch))
    while live:
        trees = {}
        for rid in live:  # draft for the whole batch, then verify, then draft-extend
            t0 = time.perf_counter()
            trees[rid] = drafter.propose(rid, NUM_DRAFT_TOKENS)
            timings.append(time.perf_counter() - t0)
        for rid in live:
            out = rows[rid]["output_ids"]
            k = trees[rid].accepted(out[pos[rid] :]) + 1  # plus the bonus token
            k = min(k, len(out) - pos[rid])  # the server stops at max_new_tokens / EOS
            drafter.append(rid, out[pos[rid] : pos[rid] + k])
            pos[rid] += k
            steps[rid] += 1
        for rid in [r for r in live if pos[r] >= len(rows[r]["output_ids"])]:
            live.remove(rid)
            drafter.forget(rid)
    return [len(rows[r]["output_ids"]) / steps[r] for r in rids if steps[r]]


class NgramReference:
    """SGLang's NGRAM corpus behind ContextDrafter's methods, fed as `ngram_worker.py` feeds it.

    One corpus for every request; nothing is inserted at prefill; after each verify the last
    `max_trie_depth` committed tokens go in, without that step's accepted tokens (the
    synchronous scheduler, which SGLang forces for NGRAM on CPU, appends them afterwards).
    """

    MAX_TRIE_DEPTH = 18  # SGLang's defaults (arg_groups/fields/spec.py)

    def __init__(self) -> None:
        # SGLang JIT-builds the corpus (once, cached) with the `ninja` of this venv.
        os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
        from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

        self.corpus = NgramCorpus(max_trie_depth=self.MAX_TRIE_DEPTH, min_bfs_breadth=1, max_bfs_breadth=10,
                                  draft_token_num=NUM_DRAFT_TOKENS, match_type="BFS", capacity=1_000_000)  # fmt: skip
        self.seqs: dict[str, list[int]] = {}

    def start(self, rid: str, tokens: list[int], group: str | None = None) -> None:
        self.seqs[rid] = list(tokens)

    def append(self, rid: str, tokens: list[int]) -> None:
        self.corpus.batch_put([self.seqs[rid][-self.MAX_TRIE_DEPTH :]])
        self.seqs[rid] += tokens

    def forget(self, rid: str) -> None:
        self.corpus.erase_match_state([rid])
        del self.seqs[rid]

    def propose(self, rid: str, num_nodes: int) -> DraftTree:
        seq = self.seqs[rid]
        self.corpus.synchronize()
        ids, mask = self.corpus.batch_get([rid], [seq[-self.MAX_TRIE_DEPTH :]], [len(seq)])
        mask = mask.reshape(num_nodes, num_nodes)
        # A node's parent is its nearest ancestor (the mask row is ancestor-or-self).
        parents = tuple([-1] + [max(j for j in range(i) if mask[i][j]) for i in range(1, num_nodes)])
        return DraftTree(tuple(int(t) for t in ids), parents)


def simulate(data: dict, config: ContextDraftConfig | None, rounds: int = 1) -> dict[str, float]:
    """Mean accept length per (workload, bench|held-out), replayed in the benchmark's order.

    `config` None replays SGLang's NGRAM instead of the context drafter. Later rounds repeat
    the same prompts to the same drafter, as `bench_speculative.py --rounds` does.
    """
    bench_q = data["bench_questions"]
    drafter = ContextDrafter(config) if config else NgramReference()  # one per server, like the worker's
    results: dict[str, list[float]] = {}
    timings: list[float] = []
    warmup = data["workloads"]["vicuna"][0][0]
    replay_batch(drafter, [{**warmup, "output_ids": warmup["output_ids"][:WARMUP_TOKENS]}], "warmup", None, [])
    splits = [("bench", slice(0, bench_q)), ("held-out", slice(bench_q, None))]
    for r, (split, sl) in itertools.product(range(rounds), splits):
        for name, batches in data["workloads"].items():
            grouped = name == "branches"
            for i, batch in enumerate(batches[sl]):
                tag = f"{r}-{split}-{name}-{i}"
                acc = replay_batch(drafter, batch, tag, tag if grouped else None, timings)
                results.setdefault(f"{name} {split}", []).extend(acc)
    out = {k: statistics.mean(v) for k, v in results.items()}
    timings.sort()
    out["propose us (median)"] = 1e6 * timings[len(timings) // 2]
    out["propose us (p99)"] = 1e6 * timings[int(len(timings) * 0.99)]
    return out


def parse_config(overrides: list[str]) -> ContextDraftConfig:
    """ContextDraftConfig with FIELD=VALUE overrides, each cast to its default's type."""
    base = ContextDraftConfig()
    changes = {}
    for item in overrides:
        name, _, value = item.partition("=")
        if not hasattr(base, name):
            raise SystemExit(f"--set {item}: ContextDraftConfig has no field {name!r}")
        changes[name] = type(getattr(base, name))(value)
    return dataclasses.replace(base, **changes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=["simulate", "record"], default="simulate")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--rounds", type=int, default=1, help="repeat every prompt, as the benchmark's --rounds")
    parser.add_argument("--no-ngram", action="store_true", help="skip the NGRAM baseline")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a ContextDraftConfig field, e.g. --set depth_decay=0.7")  # fmt: skip
    args = parser.parse_args()
    if args.command == "record":
        record(args.data)
        return
    data = json.loads(args.data.read_text())
    columns = {"context": simulate(data, parse_config(args.set), args.rounds)}
    if not args.no_ngram:
        columns = {"NGRAM": simulate(data, None, args.rounds), **columns}
    print(f"{data['model']} {data['dtype']}, {data['max_new_tokens']} new tokens, "
          f"{NUM_DRAFT_TOKENS} draft tokens, {args.rounds} round(s); accept length")  # fmt: skip
    print(f"{'':22}" + "".join(f"{c:>10}" for c in columns))
    for key in columns["context"]:
        print(f"{key:22}" + "".join(f"{col[key]:10.2f}" for col in columns.values()))


if __name__ == "__main__":
    main()
