"""`python -m sglang_specsot.bench`: the end-to-end SpecSoT benchmark.

    e2e      start the servers, run every pending cell (resumable), then write the report
    report   rebuild report.json, report.md and plots/ from a run directory's cells.jsonl
    judge    pairwise judgement of SoT answers vs plain answers by a judge model (resumable)
    judge-controls  a judge's control score: real answers against worse copies, both orders
    blind-packets  a run's control and real pairs as shuffled blind packets for outside readers
    blind-score    those readers' verdicts as the run's judge: judge_controls.json and judge.jsonl
    serving  SGLang's own bench_serving on the same questions (see bench/serving.py)
    scale-sim    p50/p95 and throughput over replicas, simulated from one replica's curve
    dp-placement  an SoT answer's branches kept on one DP rank vs spread, side by side
    teacher-trace  a draft's greedy chain acceptance on a run's recorded answers, offline (no server)
    trace-compare  two trace folders of the same answers (served, teacher-forced), step for step
    trace-shapes  an e2e run's acceptance trace and answer shapes, compact, for the device's replay
    gpu-predict  predicted GPU latency of every route from a roofline and the runs' acceptance (not a measurement)
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from sglang_specsot.bench.provenance import record_invocation
from sglang_specsot.models.fetcher import FetchError  # an offline or failed fetch: one line

PROG = "python -m sglang_specsot.bench"


def _e2e(args) -> int:
    from sglang_specsot.bench.e2e import build_report, plan_from_args
    from sglang_specsot.bench.runner import run

    plan = plan_from_args(args)
    # Ratios between configurations are measured side by side only with every server up;
    # one server at a time, they span the machine's drift between blocks.
    schedule = f"one server at a time, blocks of {plan.block}" if plan.one_at_a_time else "all servers up, interleaved per question"
    record_invocation(plan.out, servers=schedule)
    todo = plan.pending()
    print(f"{len(plan.questions)} questions x {len(plan.configs)} configurations; {len(todo)} cells to run "
          f"({schedule}); results in {plan.out}", flush=True)  # fmt: skip
    run(plan)
    if not args.no_report:
        print(build_report(plan.out, quality=not args.no_quality)["table"])
    return 0


def _report(args) -> int:
    from sglang_specsot.bench.e2e import build_report

    report = build_report(Path(args.out), quality=not args.no_quality)
    print(report["table"])
    for name, eq in report["greedy_equality"].items():
        print(f"greedy {name}: {eq['equal']}/{eq['of']}")
    for name, speed in report["lossless_speed"].items():
        print(f"per-token speed {name}: {speed['per_token_speed']:.3f}x over {speed['n']} questions")
    print(f"failed cells: {len(report['failed'])}; written: {args.out}/report.json, report.md, plots/")
    return 0


def _judge(args) -> int:
    from sglang_specsot.bench.judge_run import judge_by_url, run_judge

    record_invocation(Path(args.out))
    configs = args.configs.split(",")
    if args.judge_url:
        line = judge_by_url(Path(args.out), _chat_judge(args), args.judge_name or args.judge_url, configs)
        print(line)
        return 0
    print(f"judged {run_judge(Path(args.out), args.judge_model, configs, args.timeout)} pairs")
    return 0


def _chat_judge(args):
    from sglang_specsot.bench.chat_judge import ChatJudge

    return ChatJudge(args.judge_url, args.judge_name or "default", args.judge_max_tokens, args.timeout)


def _judge_controls(args) -> int:
    from sglang_specsot.bench.judge_run import controls_cli

    dest = Path(args.dest or args.out)
    record_invocation(dest)
    print(controls_cli(Path(args.out), dest, args, _chat_judge))
    return 0


def _blind_packets(args) -> int:
    from sglang_specsot.bench.blind import packets_cli

    print(packets_cli(args))
    return 0


def _blind_score(args) -> int:
    from sglang_specsot.bench.blind import score_cli

    record_invocation(Path(args.dest or args.out))
    print(score_cli(args))
    return 0


def _add_blind(sub) -> None:
    p = sub.add_parser("blind-packets", help="a run's pairs as blind packets for outside readers (bench/blind.py)")
    p.add_argument("out", help="the run directory (its normal answers build the controls)")
    p.add_argument("--configs", default="SoT-server", help="the SoT configurations of the real pairs")
    p.add_argument("--out", dest="dest", required=True, help="the packet folder (packets, rubric.md, keys.json)")
    p.add_argument("--readers", type=int, default=4, help="packets, one per reader (at least 2)")
    p.add_argument("--seed", type=int, default=0, help="the shuffle of the items and of the shuffled-half control")
    p.set_defaults(run=_blind_packets)
    p = sub.add_parser("blind-score", help="blind readers' verdicts as the run's judge (bench/blind.py)")
    p.add_argument("out", help="the run directory the packets were built from")
    p.add_argument("folder", help="the packet folder: keys.json and the readers' verdicts-*.jsonl")
    p.add_argument("--judge-name", required=True, help='who judged, as the report names it ("an LLM reader, blind")')
    p.add_argument("--dest", default=None, help="where judge_controls.json and judge.jsonl go (default: the run directory)")
    p.set_defaults(run=_blind_score)


def _add_judge_endpoint(p) -> None:
    p.add_argument("--judge-url", default=None,
                   help="an OpenAI-compatible endpoint (base URL) to judge with, instead of serving --judge-model")
    p.add_argument("--judge-name", default=None, help="the endpoint's model name (recorded as the judge's name)")
    p.add_argument("--judge-max-tokens", type=int, default=8,
                   help="reply tokens: 8 for a one-word judge, a few hundred for one that reasons before its verdict")


def _serving(args) -> int:
    from sglang_specsot.bench.serving import main as serving_main

    return serving_main(args)


def _gpu_predict(args) -> int:
    from sglang_specsot.bench.gpu_prediction import prediction_table

    print(prediction_table(Path(args.root)))
    return 0


def _trace_shapes(args) -> int:
    import json

    from sglang_specsot.bench.trace_shapes import write

    summary = write(Path(args.out), [Path(r) for r in args.runs], [Path(t) for t in args.trace])
    print(json.dumps(summary, indent=1))
    print(f"written: {args.out}/answers.jsonl, trace.jsonl, acceptance.json")
    return 0


def _trace_compare(args) -> int:
    from sglang_specsot.bench.trace_compare import compare, summary

    print(summary(compare(Path(args.a), Path(args.b))))
    return 0


def _teacher_trace(args) -> int:
    import json

    from sglang_specsot.bench.teacher_trace import TeacherDraft, write
    from sglang_specsot.data import load_questions
    from sglang_specsot.bench.e2e import resolve_model

    run = Path(args.run_dir)
    settings = json.loads((run / "run.json").read_text())
    questions = {q["id"]: q["question"] for q in load_questions(settings["questions"])}
    teacher = TeacherDraft(resolve_model(args.draft, "draft"), resolve_model(settings["target"], "target"))
    summary = write(run, questions, teacher, Path(args.out), k=args.k)
    print(json.dumps(summary, indent=1))
    print(f"written: {args.out}/answers.jsonl, trace.jsonl, acceptance.json")
    return 0


def _add_e2e(sub) -> None:
    p = sub.add_parser("e2e", help="run the benchmark (resumable)")
    p.add_argument("--target", required=True, help="registry name (python -m sglang_specsot.models list) or a checkpoint dir")
    p.add_argument("--draft", default=None, help="draft model for STANDALONE and SPECSOT (same vocabulary)")
    p.add_argument("--questions", default="vicuna80", help="question set name or .jsonl path")
    p.add_argument("--limit", type=int, default=None, help="use the first N questions of the set")
    p.add_argument("--suitable", type=int, default=None, help="then keep the first N SoT-suitable ones")
    p.add_argument("--unsuitable", type=int, default=None, help="and the first N unsuitable ones")
    p.add_argument("--configs", default=None, help="comma-separated configurations (plain is always run)")
    p.add_argument("--max-tokens", type=int, default=384, help="answer token cap (normal and SoT alike)")
    p.add_argument("--dtype", default="bfloat16", help="float32 makes greedy equality a must")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per cell")
    p.add_argument("--sot-config", default=None, help="JSON of SoTConfig fields for both SoT routes")
    p.add_argument("--warm-prefixes", action="store_true",
                   help="after each cache flush, prefill the prompts' fixed prefixes (chat header, "
                        "SoT's skeleton examples) untimed, as a serving server holds them")  # fmt: skip
    p.add_argument("--warm-up", action="store_true",
                   help="ask every fresh server one untimed question per kind of cell it serves (normal, "
                        "server-side SoT, frontend) before its measured cells")  # fmt: skip
    p.add_argument("--system-prompt", default=None,
                   help="a system message before every question, normal and SoT alike (SoT plans and "
                        "writes under it)")  # fmt: skip
    p.add_argument("--token-map", default=None, metavar="PATH|qwen2.5",
                   help="SPECSOT's --speculative-token-map: its draft's LM head keeps only these tokens "
                        "(a .pt file, or the name of a map the package ships)")  # fmt: skip
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="SPECSOT servers draft their whole window and record each step's tree and accepted path "
                        "(PATH-<server>.jsonl; bench trace-shapes joins them to the answers)")  # fmt: skip
    p.add_argument("--one-at-a-time", choices=("auto", "yes", "no"), default="auto",
                   help="one server at a time in rounds over question blocks (auto: unless every server fits in memory at once)")
    p.add_argument("--block", type=int, default=6, help="questions per round when one server runs at a time")
    p.add_argument("--out", default=None, help="run directory (default benchmarks/e2e-TARGET[-DRAFT])")
    p.add_argument("--no-report", action="store_true")
    p.add_argument("--no-quality", action="store_true", help="skip the embedding-based quality measures")
    p.set_defaults(run=_e2e)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_e2e(sub)
    p = sub.add_parser("report", help="rebuild the report from a run directory")
    p.add_argument("out")
    p.add_argument("--no-quality", action="store_true")
    p.set_defaults(run=_report)
    p = sub.add_parser("judge", help="pairwise judge pass over a run directory")
    p.add_argument("out")
    p.add_argument("--judge-model", default="qwen2.5-coder-1.5b")
    p.add_argument("--configs", default="SoT-server,SoT-frontend,SpecSoT-server,SpecSoT-frontend,SpecSoT-router")
    p.add_argument("--timeout", type=float, default=300.0)
    _add_judge_endpoint(p)
    p.set_defaults(run=_judge)
    p = sub.add_parser("judge-controls", help="a judge's control score on a run's normal answers")
    p.add_argument("out", help="the run directory whose normal answers build the controls")
    p.add_argument("--judge-model", default="qwen2.5-coder-1.5b", help="served as `judge` serves it, unless --judge-url")
    p.add_argument("--questions", type=int, default=None, help="build controls from the first N normal answers")
    p.add_argument("--real", type=int, default=None, help="ask the first N real (SoT, normal) pairs (default all)")
    p.add_argument("--configs", default="SoT-server", help="the SoT configurations of the real pairs")
    p.add_argument("--recorded-real", action="store_true",
                   help="take the real pairs' verdicts from the run's judge.jsonl (its judge) instead of asking")
    p.add_argument("--seed", type=int, default=0, help="the shuffle of the shuffled-half control")
    p.add_argument("--dest", default=None, help="where judge_controls.json goes (default: the run directory)")
    p.add_argument("--timeout", type=float, default=300.0)
    _add_judge_endpoint(p)
    p.set_defaults(run=_judge_controls)
    _add_blind(sub)
    from sglang_specsot.bench.serving import add_arguments

    add_arguments(sub.add_parser("serving", help="sglang.bench_serving on the questions, merged table"))
    sub.choices["serving"].set_defaults(run=_serving)
    p = sub.add_parser("teacher-trace", help="a draft's chain acceptance on a run's answers, offline (bench/teacher_trace.py)")
    p.add_argument("run_dir", metavar="RUN", help="an e2e run directory with plain (and SoT-server) cells")
    p.add_argument("--draft", required=True, help="the draft model: registry name or checkpoint dir")
    p.add_argument("--k", type=int, default=4, help="draft tokens a step (SPECSOT's --speculative-num-steps)")
    p.add_argument("--out", required=True, help="the folder for answers.jsonl, trace.jsonl and acceptance.json")
    p.set_defaults(run=_teacher_trace)
    p = sub.add_parser("trace-shapes", help="a traced run's answer shapes and acceptance for the replay (bench/trace_shapes.py)")
    p.add_argument("runs", nargs="+", help="e2e run directories (plain, SPECSOT and SpecSoT-server cells)")
    p.add_argument("--trace", nargs="+", required=True, help="the SGLANG_SPECSOT_TRACE files of those runs")
    p.add_argument("--out", required=True, help="the folder for answers.jsonl, trace.jsonl and acceptance.json")
    p.set_defaults(run=_trace_shapes)
    p = sub.add_parser("trace-compare", help="two trace folders of the same answers, step for step (bench/trace_compare.py)")
    p.add_argument("a", help="a trace folder (bench trace-shapes: a served run)")
    p.add_argument("b", help="a trace folder of the same run's answers (bench teacher-trace)")
    p.set_defaults(run=_trace_compare)
    p = sub.add_parser("gpu-predict", help="H100 latency predicted from a roofline and the runs' step logs")
    p.add_argument("--root", default=".", help="the repository root the benchmark files are read under")
    p.set_defaults(run=_gpu_predict)
    from sglang_specsot.bench import scale_sim

    p = sub.add_parser("scale-sim", help="p50/p95 and throughput over replicas, simulated from one replica's curve")
    scale_sim.add_arguments(p)
    p.set_defaults(run=scale_sim.run_cli)
    from sglang_specsot.bench import dp_placement

    p = sub.add_parser("dp-placement", help="an SoT answer's branches kept on one DP rank vs spread, side by side")
    dp_placement.add_arguments(p)
    p.set_defaults(run=dp_placement.run_cli)
    return parser


def _stop_on_sigterm() -> None:
    """SIGTERM (`kill PID`, a job runner stopping the job) unwinds like Ctrl-C, so the servers
    are stopped; a background job ignores SIGINT, so SIGTERM is how one stops it."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[specsot-bench] %(message)s")
    _stop_on_sigterm()
    try:
        return args.run(args)
    except (ValueError, OSError, FetchError) as exc:
        print(f"error: {exc}", file=sys.stderr)  # bad input: one line the user can act on
        return 2
    except KeyboardInterrupt:
        print("interrupted; finished cells are kept, re-run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
