"""Speculative decoding on this CPU, side by side: plain, NGRAM, STANDALONE (or EAGLE3) and SPECSOT.

All servers run at once (idle ones sleep) and are measured in alternating rounds on the same
prompts, so machine drift hits every configuration alike. Each server's cache is flushed
(untimed) before every measured batch: NGRAM's corpus and SPECSOT's context drafter would
otherwise draft round 2 from round 1's answers to the same prompts, and a question's
branches from its Vicuna answer. Two prompt sets:
  vicuna   - Vicuna questions, one request each (batch 1)
  branches - SoT branch prompts: every point of one skeleton expanded in one batch, tagged
             as one SoT group, after their shared prefix is prefilled once (what the SoT
             program sends)
  sot      - the question's whole server-side SoT answer (its skeleton, then its branches),
             asked as a client asks (/v1/chat/completions, "specsot" mode "on"); its cap
             is --max-new-tokens for the whole answer. With it the plain server delays
             sampling (SGLANG_ENABLE_DELAY_SAMPLE) so it runs the skeleton constraint too.
The order of the configurations rotates from one batch to the next, so none is always
measured first after a flush or last before the next batch.
Configurations: plain decoding, NGRAM and SPECSOT-ctx (SoT-context drafting, no second model);
with --draft also STANDALONE and SPECSOT with that draft model, both with a --steps chain
(SPECSOT adds up to 3 SoT-context nodes to it); where --draft is an EAGLE-3 head (e.g. one
`python -m sglang_specsot.models train-eagle3` wrote), SGLang's EAGLE3 takes STANDALONE's place. With --adaptive, each SPECSOT config also
runs with --speculative-adaptive ("+ad"); SPECSOT sizes its drafts from its measured cost
model without the flag too, so "+ad" runs the same policy unless a config file is given.
With --fixed, each also runs drafting its whole window every step ("-fixed",
SGLANG_SPECSOT_FIXED_WINDOW=1), to compare with the cost-sized drafts. With --code NAME=DIR,
each SPECSOT config also runs from the source tree DIR ("@NAME", e.g. a `git worktree` of
another commit, put first on the server's PYTHONPATH): an A/B of two versions of the code.
With --plain-twin, a second plain server ("plain-2") runs too, an A/A control: where the start
order or the machine's drift moves a server's speed, plain-2 against plain shows by how much,
and each config is also reported against both plain servers' geometric mean (plain starts first
and plain-2 last unless --start-order says otherwise, so the two bracket the others). With
--step-logs, each SPECSOT server writes its step log (SGLANG_SPECSOT_STEP_LOG) beside its server
log: each phase's time of each step, so its own work beside the target's forward is measured
inside one server, whatever its start order (`examples/step_log_report.py`).
Prints accept length, draft tokens spent per verify (meta_info spec_cap_length), output
tokens/s and the ratio to plain decoding for each, and the machine's load average; for
SPECSOT, also how often a draft at each chain depth was accepted given its parent was,
split by where the chain started (SGLang's draft-extend or a deferred extend's catch-up).

    .venv/bin/python examples/bench_speculative.py --model smollm2-135m
    .venv/bin/python examples/bench_speculative.py --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from transformers import AutoTokenizer

from sglang_specsot.bench.ceiling import specsot_part
from sglang_specsot.bench.cells import flush_cache
from sglang_specsot.bench.configs import DELAY_SAMPLE, baseline_algorithm
from sglang_specsot.bench.runner import rotated
from sglang_specsot.cpu.draft_int8 import DRAFT_INT8_ENV
from sglang_specsot.data import load_questions
from sglang_specsot.launch import ServerProcess
from sglang_specsot.models import fetch as fetch_model
from sglang_specsot.sot import expansion_prompt
from sglang_specsot.speculative.policy.config import FIXED_WINDOW_ENV
from sglang_specsot.speculative.step_log import ENV as STEP_LOG_ENV
from sglang_specsot.speculative.token_map import resolve_map
from sglang_specsot.sot.runner import shared_prefix

COMMON = ["--device", "cpu", "--attention-backend", "specsot_cpu", "--max-total-tokens", "16384",
          "--sleep-on-idle"]  # fmt: skip
SKELETON = ["Set clear goals", "Prioritize tasks", "Avoid distractions", "Take short breaks",
            "Use a calendar", "Limit multitasking", "Delegate work", "Review your day"]  # fmt: skip
SEED = 0
PLAIN_TWIN = "plain-2"  # --plain-twin: a second plain server, the A/A control


def fetch(name: str) -> str:
    """The fetched checkpoint directory of `name` (downloads and converts it the first time)."""
    return str(fetch_model(name))


def configs(
    draft_path: str | None, num_draft: int, steps: int, topk: int, model_tree: int, adaptive: bool = False,
    fixed: bool = False, bf16_draft: bool = False, variants: dict[str, str] | None = None,
    token_map: str | None = None, code: dict[str, str] | None = None, plain_twin: bool = False,
) -> dict[str, list[str]]:  # fmt: skip
    """Plain, NGRAM and SPECSOT from the SoT context alone; with a draft model also
    STANDALONE and SPECSOT, both drafting a `model_tree`-node tree (`steps` x `topk`) with it;
    SPECSOT's verify window holds 3 SoT-context nodes more. `fixed` adds a `-fixed` twin of
    each SPECSOT config without --speculative-adaptive (its server gets `server_env`);
    `token_map` a `SPECSOT-hot` twin of SPECSOT whose draft head keeps that map's tokens;
    `plain_twin` a second plain server, `plain-2` (an A/A control)."""
    out = {
        "plain": [],
        "NGRAM": ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(num_draft)],
        "SPECSOT-ctx": ["--speculative-algorithm", "SPECSOT", "--speculative-num-draft-tokens", str(num_draft)],
    }
    if draft_path:
        shape = ["--speculative-draft-model-path", draft_path, "--speculative-num-steps", str(steps),
                 "--speculative-eagle-topk", str(topk)]  # fmt: skip
        algorithm = baseline_algorithm(draft_path)  # STANDALONE, or EAGLE3 for an EAGLE-3 head
        out[algorithm] = ["--speculative-algorithm", algorithm, *shape,
                          "--speculative-num-draft-tokens", str(model_tree)]  # fmt: skip
        out["SPECSOT"] = ["--speculative-algorithm", "SPECSOT", *shape,
                          "--speculative-num-draft-tokens", str(model_tree + 3)]  # fmt: skip
    if token_map and draft_path:
        out["SPECSOT-hot"] = out["SPECSOT"] + ["--speculative-token-map", token_map]
    plain_specsot = [n for n in out if n.startswith("SPECSOT")]
    for name, path in (variants or {}).items():
        # SPECSOT reads a config file only with the flag (worker.adaptive_config).
        out[f"SPECSOT-{name}"] = out["SPECSOT"] + ["--speculative-adaptive", "--speculative-adaptive-config", path]
    if adaptive:
        for name in plain_specsot:
            out[f"{name}+ad"] = out[name] + ["--speculative-adaptive"]
    if fixed:
        for name in plain_specsot:
            out[f"{name}-fixed"] = list(out[name])
    if bf16_draft:
        for name in [n for n in out if n.startswith("SPECSOT") and not n.startswith("SPECSOT-ctx")]:
            out[f"{name}-bf16"] = list(out[name])
    for tree in code or ():
        for name in [n for n in out if n.startswith("SPECSOT") and "@" not in n]:
            out[f"{name}@{tree}"] = list(out[name])
    if plain_twin:  # last, so by default it starts last: plain first and it bracket the rest
        out[PLAIN_TWIN] = []
    return out


def parse_variants(specs: list[str], directory: Path, max_budget: int) -> dict[str, str]:
    """NAME=JSON per variant -> NAME: the path of its adaptive config, every budget 0..
    `max_budget` a candidate (SPECSOT's default) unless the JSON names its own
    `candidate_steps` (for every batch size; [0] never drafts: SPECSOT's own plain steps),
    and the JSON's other keys under "specsot"."""
    out = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"--variant {spec!r}: write NAME=JSON, e.g. noru='{{\"runner_ups\": false}}'")
        keys = json.loads(text)
        if not isinstance(keys, dict):
            raise ValueError(f"--variant {spec!r}: the JSON must be an object of SPECSOT's adaptive keys")
        steps = keys.pop("candidate_steps", list(range(max_budget + 1)))
        path = directory / f"adaptive-{name}.json"
        path.write_text(json.dumps({"1": {"candidate_steps": steps}, "specsot": keys}))
        out[name] = str(path)
    return out


def server_env(
    name: str, code: dict[str, str] | None = None, delay_sample: bool = False, step_logs: Path | None = None
) -> dict[str, str]:
    """A `-fixed` config drafts its whole window every step; the others size drafts from costs.
    A `-bf16` config keeps the draft model's weights as loaded (no int8 copy on CPU). An
    `@NAME` config imports sglang_specsot from `code[NAME]` (its PYTHONPATH comes first).
    `delay_sample`: plain decoding delays sampling, as SoT's skeleton constraint needs on
    SGLang's overlap scheduler (what `bench e2e`'s plain server does), its twin too.
    `step_logs`: a SPECSOT server writes its step log there, as `steps-NAME.jsonl`."""
    base, _, tree = name.partition("@")
    env = {FIXED_WINDOW_ENV: "1"} if "-fixed" in base else {}
    if delay_sample and base in ("plain", PLAIN_TWIN):
        env.update(DELAY_SAMPLE)
    if step_logs is not None and base.startswith("SPECSOT"):
        env[STEP_LOG_ENV] = str(step_logs / f"steps-{name}.jsonl")
    if base.endswith("-bf16"):
        env[DRAFT_INT8_ENV] = "off"
    if tree:
        env["PYTHONPATH"] = (code or {})[tree]
    return env


def parse_code(specs: list[str]) -> dict[str, str]:
    """NAME=DIR per --code: a source tree holding sglang_specsot/ (e.g. a git worktree)."""
    out = {}
    for spec in specs:
        name, sep, directory = spec.partition("=")
        if not sep or not name.isidentifier() or not Path(directory, "sglang_specsot").is_dir():
            raise ValueError(f"--code {spec!r}: write NAME=DIR, DIR a source tree with sglang_specsot/ "
                             "(e.g. `git worktree add /tmp/base HEAD~1`, then --code base=/tmp/base)")
        out[name] = str(Path(directory).resolve())
    return out


def suitable_questions(question_set: str, n_questions: int, skip: int = 0) -> list[str]:
    """The SoT-suitable questions `skip` .. `skip + n_questions` of a question set ("vicuna80"
    or a JSONL path whose rows carry "sot_suitable")."""
    rows = load_questions(question_set)
    suitable = [r["question"] for r in rows if r.get("sot_suitable")]
    if skip < 0 or n_questions < 1 or skip + n_questions > len(suitable):
        raise ValueError(
            f"--skip {skip} --questions {n_questions}: {question_set} has {len(suitable)} SoT-suitable "
            f"questions; pick skip >= 0 and questions >= 1 with skip + questions <= {len(suitable)}"
        )
    return suitable[skip : skip + n_questions]


def workloads(tokenizer, questions: list[str], points: int = 4) -> dict[str, list[tuple[list[str], dict | None]]]:
    """Each workload: a list of (batch of prompts, SoT tag factory or None); a branch batch
    expands the first `points` points of SKELETON."""
    if not 1 <= points <= len(SKELETON):
        raise ValueError(f"--points {points} is outside 1..{len(SKELETON)}; pass a point count in that range")
    skeleton = SKELETON[:points]
    chat = lambda msgs: tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)  # noqa: E731
    vicuna = [([chat([{"role": "user", "content": q}])], None) for q in questions]
    branches = [
        ([expansion_prompt(q, skeleton, i).render(chat) for i in range(points)], {"n": points})
        for q in questions
    ]
    sot = [([q], SOT_ANSWER) for q in questions]
    return {"vicuna": vicuna, "branches": branches, "sot": sot}


# A "sot" batch's tag: the question is asked for a forced SoT answer (no opening read, so every
# server answers by SoT whatever the normal answer's shape).
SOT_ANSWER = {"sot": {"mode": "on", "config": {"read_opening": False}}}


def run_batch(
    server: ServerProcess, prompts: list[str], tag: dict | None, max_new: int
) -> tuple[int, float, list, list[str]]:
    """(completion tokens, seconds, per answer (accept length, draft tokens per verify), texts)."""
    if tag is not None and "sot" in tag:
        return _sot_answer(server, prompts[0], tag["sot"], max_new)
    params = [{"temperature": 0, "max_new_tokens": max_new} for _ in prompts]
    if tag is not None:
        group = uuid.uuid4().hex
        for i, p in enumerate(params):
            p["custom_params"] = {"specsot": {"group": group, "role": "branch", "point": i, "n": tag["n"]}}
    t0 = time.perf_counter()
    if tag is not None:  # as the SoT program does: the branches' shared prompt prefilled once
        server.post("/generate", {"text": shared_prefix(prompts), "sampling_params": {"max_new_tokens": 0}})
    out = server.post("/generate", {"text": prompts, "sampling_params": params})
    elapsed = time.perf_counter() - t0
    out = out if isinstance(out, list) else [out]
    tokens = sum(o["meta_info"]["completion_tokens"] for o in out)
    spent = [o["meta_info"].get("spec_cap_length") for o in out]  # SPECSOT's draft tokens per verify
    accept = [(o["meta_info"].get("spec_accept_length"), d) for o, d in zip(out, spent)]
    return tokens, elapsed, accept, [o["text"] for o in out]


def _sot_answer(server: ServerProcess, question: str, field: dict, max_new: int) -> tuple[int, float, list, list[str]]:
    """One server-side SoT answer, as `run_batch` reports a batch: its accept length is the
    whole answer's (skeleton and branches)."""
    body = {"model": "default", "temperature": 0, "max_tokens": max_new, "specsot": field,
            "messages": [{"role": "user", "content": question}]}  # fmt: skip
    t0 = time.perf_counter()
    out = server.post("/v1/chat/completions", body)
    elapsed = time.perf_counter() - t0
    trace = (out.get("metadata") or {}).get("specsot") or {}
    if trace.get("path") != "sot":
        print(f"SoT answer took the {trace.get('path')} path: {trace.get('reason')}", flush=True)
    accept = [(trace.get("spec_accept_length"), None)]
    return out["usage"]["completion_tokens"], elapsed, accept, [out["choices"][0]["message"]["content"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--draft", default=None, help="draft model (a fetched name or a directory; same tokenizer)")
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--question-set", default="vicuna80",
                        help="vicuna80 or a JSONL path (e.g. sglang_specsot/data/router_holdout2.jsonl); "
                        "its SoT-suitable rows are used")
    parser.add_argument("--skip", type=int, default=0,
                        help="start after this many suitable questions (to hold out the first ones)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--points", type=int, default=4, help="branches per SoT batch (1-8)")
    parser.add_argument("--workloads", default="vicuna,branches", help="comma-separated: vicuna, branches, sot")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-draft-tokens", type=int, default=6, help="verify window of NGRAM and SPECSOT-ctx")
    parser.add_argument("--steps", type=int, default=4, help="draft-model steps (STANDALONE or EAGLE3, SPECSOT)")
    parser.add_argument("--topk", type=int, default=1, help="draft-model top-k: 1 = a chain, more = a tree")
    parser.add_argument("--model-tree", type=int, default=None,
                        help="draft-model tree nodes incl. the root (default 1 + steps x topk)")
    parser.add_argument("--only", default=None, help="comma-separated configs to run (default: all; the baseline always runs)")
    parser.add_argument("--baseline", default="plain",
                        help="the config every other is compared with (default plain). An A/B of two SPECSOT "
                             "configs with a draft, e.g. --only SPECSOT,SPECSOT-noru --baseline SPECSOT-noru, "
                             "then needs only two servers, which fit in memory together: interleaved")  # fmt: skip
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--adaptive", action="store_true", help="also run each SPECSOT config with --speculative-adaptive")
    parser.add_argument("--fixed", action="store_true",
                        help="also run each SPECSOT config drafting its whole window every step "
                             "(SGLANG_SPECSOT_FIXED_WINDOW=1)")  # fmt: skip
    parser.add_argument("--bf16-draft", action="store_true",
                        help="also run each SPECSOT config with a draft model keeping the draft's weights as "
                             "loaded (\"-bf16\", SGLANG_SPECSOT_DRAFT_INT8=off)")  # fmt: skip
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                        help="also run SPECSOT (with --draft) as SPECSOT-NAME with these keys under \"specsot\" "
                             "in its adaptive config, e.g. noru='{\"runner_ups\": false}' (repeatable); a \"candidate_steps\" "
                             "list sets its budgets: plainonly='{\"candidate_steps\": [0]}' never drafts")  # fmt: skip
    parser.add_argument("--code", action="append", default=[], metavar="NAME=DIR",
                        help="also run each SPECSOT config from source tree DIR, as CONFIG@NAME (an A/B of two commits)")
    parser.add_argument("--token-map", default=None, metavar="PATH|qwen2.5",
                        help="also run SPECSOT (with --draft) as SPECSOT-hot, its draft's LM head cut to this "
                             "--speculative-token-map (a .pt file, or the name of one the package ships)")  # fmt: skip
    parser.add_argument("--mem-fraction", type=float, default=0.6,
                        help="--mem-fraction-static of every server: SGLang counts the RAM the servers started "
                             "before took, so three servers with a 1.5B target and a draft need ~0.9")  # fmt: skip
    parser.add_argument("--start-order", default=None, metavar="NAMES",
                        help="comma-separated configs in the order their servers start (default: the baseline, "
                             "then as listed); a server started later can run slower on a loaded machine, so "
                             "compare two runs with the order reversed")
    parser.add_argument("--plain-twin", action="store_true",
                        help=f"also run a second plain server, {PLAIN_TWIN!r}: an A/A control of start order and "
                             "drift; each config is also reported against both plain servers")  # fmt: skip
    parser.add_argument("--step-logs", action="store_true",
                        help="each SPECSOT server writes its step log (phase times of every step) beside its log")
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="one server alive at a time (a 1.5B target with a draft needs ~8 GB per server)")
    args = parser.parse_args()

    try:  # before the downloads: a bad --skip or --question-set should not wait minutes for its error
        questions = suitable_questions(args.question_set, args.questions, args.skip)
    except ValueError as exc:
        parser.error(str(exc))
    model = fetch(args.model)
    draft = (args.draft if Path(args.draft).is_dir() else fetch(args.draft)) if args.draft else None
    tokenizer = AutoTokenizer.from_pretrained(model)
    loads = workloads(tokenizer, questions, args.points)
    wanted = args.workloads.split(",")
    unknown = set(wanted) - set(loads)
    if unknown:
        parser.error(f"--workloads: unknown {sorted(unknown)}; choose from {sorted(loads)}")
    loads = {name: batches for name, batches in loads.items() if name in wanted}
    logs = Path(tempfile.mkdtemp(prefix="bench-speculative-"))
    variants = parse_variants(args.variant, logs, max_budget=(args.model_tree or 1 + args.steps * args.topk) + 2)
    if variants and not draft:
        parser.error("--variant: SPECSOT variants need --draft")
    if args.token_map and not draft:
        parser.error("--token-map: SPECSOT-hot needs --draft")
    try:
        token_map = resolve_map(args.token_map) if args.token_map else None
        code = parse_code(args.code)
    except ValueError as exc:
        parser.error(str(exc))
    every = configs(draft, args.num_draft_tokens, args.steps, args.topk, args.model_tree or 1 + args.steps * args.topk,
                    args.adaptive, args.fixed, args.bf16_draft, variants, token_map, code, args.plain_twin)  # fmt: skip
    if args.baseline not in every:
        parser.error(f"--baseline {args.baseline!r} is not a configuration of this run; choose from {sorted(every)}")
    sot = "sot" in loads  # server-side SoT: the skeleton constraint needs a logit processor
    common = COMMON + ["--dtype", args.dtype, "--mem-fraction-static", str(args.mem_fraction)]
    common += ["--enable-custom-logit-processor"] if sot else []
    step_logs = logs if args.step_logs else None
    always = (args.baseline, PLAIN_TWIN)  # besides the configs --only names
    servers = {name: ServerProcess(model, common + extra, env=server_env(name, code, sot, step_logs),
                                   log_path=logs / f"{name}.log")  # fmt: skip
               for name, extra in every.items()
               if args.only is None or name in always or name in args.only.split(",")}
    try:
        print(f"servers start in the order {start_order(list(servers), args.start_order)}", flush=True)
    except ValueError as exc:
        parser.error(str(exc))
    stats = {(c, w): {"tokens": 0, "seconds": 0.0, "accept": [], "spent": [], "depth": {}, "texts": {}, "rounds": {}}
             for c in servers for w in loads}  # fmt: skip
    print(f"load average at start: {os.getloadavg()}", flush=True)
    print(f"server logs in {logs}", flush=True)
    run = run_one_at_a_time if args.one_at_a_time else run_interleaved
    run(servers, loads, stats, args)
    report(stats, list(servers), list(loads), args)


def _depth_counts(server) -> dict:
    """SPECSOT's acceptance by chain depth so far ({} for other servers)."""
    state = server.get("/server_info")["internal_states"][0]
    return state.get("specsot", {}).get("acceptance_by_depth", {})


def _add_depth_counts(into: dict, before: dict, after: dict) -> None:
    """Add what `after` counted beyond `before` (per source and depth) to `into`."""
    for source, counts in after.items():
        old = before.get(source, {})
        total = into.setdefault(source, {})
        for key in ("reached", "accepted"):
            rows = _padded([total.get(key, []), counts[key], old.get(key, [])])
            total[key] = [t + n - o for t, n, o in zip(*rows)]


def _padded(lists: list[list[int]]) -> list[list[int]]:
    width = max(map(len, lists))
    return [xs + [0] * (width - len(xs)) for xs in lists]


def _measure(server, name, workload, prompts, tag, stats, max_new, round_: int) -> None:
    flush_cache(server.base_url, 60.0)  # no drafting from an earlier answer to the same prompt
    before = _depth_counts(server)
    tokens, secs, accept, texts = run_batch(server, prompts, tag, max_new)
    s = stats[(name, workload)]
    for prompt, text in zip(prompts, texts):  # compared with plain decoding's answer to the same prompt
        s["texts"][(round_, prompt)] = text
    _add_depth_counts(s["depth"], before, _depth_counts(server))
    s["tokens"] += tokens
    s["seconds"] += secs
    per_round = s["rounds"].setdefault(round_, [0, 0.0])
    per_round[0] += tokens
    per_round[1] += secs
    s["accept"] += [a for a, _ in accept if a]
    s["spent"] += [d for _, d in accept if d is not None]


def start_order(names: list[str], wanted: str | None) -> list[str]:
    """The configs' servers in start order: `wanted` (comma-separated) first, the rest after."""
    if not wanted:
        return names
    first = wanted.split(",")
    unknown = [n for n in first if n not in names]
    if unknown:
        raise ValueError(f"--start-order names {unknown}, which this run does not start; it starts {names}")
    return first + [n for n in names if n not in first]


def _start(name, server, loads) -> None:
    print(f"starting {name} ...", flush=True)
    server.start()
    first_batch = next(iter(loads.values()))[0][0]
    run_batch(server, first_batch[:1], None, 8)  # warm-up


def _save_server_info(name: str, server) -> None:
    """Keep a SPECSOT server's state (its part of /server_info: cost model, acceptance by depth,
    step times; and its verify window) beside its log as specsot-state-NAME.json, for
    examples/speculation_ceiling.py --server-info. The rest of /server_info is the launch's
    arguments, which the log already holds."""
    if not name.startswith("SPECSOT") or server.proc is None:
        return
    try:
        info = server.get("/server_info")
        state = {"speculative_num_draft_tokens": info.get("speculative_num_draft_tokens"), "specsot": specsot_part(info)}
    except (OSError, ValueError) as exc:  # a dead server has nothing to report; its log says why
        print(f"no SPECSOT state from {name}: {exc}", flush=True)  # and the servers after it still stop
        return
    path = server.log_path.with_name(f"specsot-state-{name}.json")
    path.write_text(json.dumps(state, indent=1, default=str))
    print(f"{name}: its SPECSOT state saved to {path}", flush=True)


def run_interleaved(servers, loads, stats, args) -> None:
    """Every server up at once; each prompt batch goes to every config in turn."""
    try:
        for name in start_order(list(servers), args.start_order):
            _start(name, servers[name], loads)
        names, turn = list(servers), 0
        for r in range(args.rounds):
            for w, batches in loads.items():
                for prompts, tag in batches:
                    for name in rotated(names, turn):  # interleaved: same prompt, every config
                        _measure(servers[name], name, w, prompts, tag, stats, args.max_new_tokens, r)
                    turn += 1
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    finally:
        for name, server in servers.items():
            _save_server_info(name, server)
            server.stop()


def run_one_at_a_time(servers, loads, stats, args) -> None:
    """For models too big to keep every server in memory: per round, each config in turn
    (the order rotating between rounds) on a fresh server, so no config's drafting corpus
    has seen an earlier round's answers."""
    names = list(servers)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            server = servers[name]
            try:
                _start(name, server, loads)
                for w, batches in loads.items():
                    for prompts, tag in batches:
                        _measure(server, name, w, prompts, tag, stats, args.max_new_tokens, r)
            finally:
                _save_server_info(name, server)
                server.stop()
                server.proc = None
        print(f"round {r + 1}/{args.rounds} done", flush=True)


def report(stats: dict, names: list[str], loads: list[str], args) -> None:
    print(f"\nmodel {args.model}, draft {args.draft} ({args.steps} steps x top-{args.topk}), "
          f"{args.questions} suitable questions of {args.question_set} after {args.skip} x {args.rounds} rounds, "
          f"{args.max_new_tokens} new tokens, "
          f"{args.points} branches per SoT batch, dtype {args.dtype}")  # fmt: skip
    print(f"load average at the end: {os.getloadavg()}")
    # "same as plain": answers whose text is plain decoding's (the baseline's) for the same
    # prompt and round. Speculation is lossless, so greedy answers differ only by numerics
    # (bf16 rounds a verify of several rows differently from a one-row decode): a speed-up
    # with fewer or other tokens would show here.
    baseline = args.baseline
    print(f"{'workload':10} {'config':14} {'accept len':>10} {'drafts/verify':>13} {'tok/s':>8} "
          f"{'vs ' + baseline:>9} {'rounds':>13} {'same as ' + baseline:>13}")  # fmt: skip
    for w in loads:
        base = tok_per_s(stats[(baseline, w)])
        for name in names:
            s = stats[(name, w)]
            rate = tok_per_s(s)
            acc = f"{statistics.mean(s['accept']):.2f}" if s["accept"] else "-"
            spent = f"{statistics.mean(s['spent']):.2f}" if s["spent"] else "-"
            same, n = same_as(s["texts"], stats[(baseline, w)]["texts"])
            spread = round_spread(s["rounds"], stats[(baseline, w)]["rounds"])
            print(f"{w:10} {name:14} {acc:>10} {spent:>13} {rate:8.2f} {rate / base:8.2f}x {spread:>13} "
                  f"{f'{same}/{n}':>13}")  # fmt: skip
    if PLAIN_TWIN in names and "plain" in names:
        print(f"\nagainst both plain servers (the geometric mean of plain's and {PLAIN_TWIN}'s tok/s):")
        for w in loads:
            cells = ", ".join(f"{n} {r:.2f}x" for n, r in against_both_plains(stats, names, w).items())
            print(f"{w:10} {cells}")
    print("\nSPECSOT acceptance by chain depth, given the parent was accepted (accepted/reached):")
    for w in loads:
        for name in names:
            for source, c in sorted(stats[(name, w)]["depth"].items()):
                cells = " ".join(f"{a}/{r}" for a, r in zip(c["accepted"], c["reached"]))
                print(f"{w:10} {name:14} {source:9} {cells}")


def tok_per_s(cell: dict) -> float:
    """A config's output tokens per second on one workload, over every round."""
    return cell["tokens"] / cell["seconds"]


def against_both_plains(stats: dict, names: list[str], workload: str) -> dict[str, float]:
    """Each config's tok/s over the geometric mean of the two plain servers' on `workload`: with
    plain started first and its twin last, a start-order effect on the ones between cancels."""
    rate = {n: tok_per_s(stats[(n, workload)]) for n in names}
    both = (rate["plain"] * rate[PLAIN_TWIN]) ** 0.5
    return {n: rate[n] / both for n in names}


def round_spread(rounds: dict, base: dict) -> str:
    """The lowest and highest of the rounds' tok/s ratios to the baseline ("-" for one round):
    how far one round's ratio strays from the run's."""
    ratios = [(t / s) / (base[r][0] / base[r][1]) for r, (t, s) in rounds.items() if r in base and s > 0]
    return f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else "-"


def same_as(texts: dict, plain: dict) -> tuple[int, int]:
    """(answers equal to plain decoding's answer to the same prompt and round, answers)."""
    return sum(text == plain.get(key) for key, text in texts.items()), len(texts)


if __name__ == "__main__":
    main()
