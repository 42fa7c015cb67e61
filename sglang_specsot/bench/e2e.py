"""From command-line arguments to a RunPlan, and from a run directory to its report."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from sglang_specsot.bench.cells import Question, Settings
from sglang_specsot.bench.configs import baseline_algorithm, matrix, select, servers
from sglang_specsot.bench.runner import RunPlan
from sglang_specsot.bench.store import CELLS_FILE, RUN_FILE, check_run_settings, load
from sglang_specsot.costs.memory import available_bytes, weight_file_bytes

# `--one-at-a-time auto` keeps every server up (each question then runs on every server in
# turn, so machine drift hits all configurations alike) when their weights, plus what a CPU
# server holds beyond its weights, fit in this share of the memory available at the start.
# Beyond weights: what a 1.5B bf16 CPU server's processes (scheduler, tokenizer manager and
# detokenizer) hold less its weights, shared pages counted once, KV included: about 3 GiB.
SERVER_RUNTIME_BYTES = 3 * 2**30
MEMORY_SHARE = 0.85


def check_model(name: str, what: str) -> None:
    """A ValueError unless `name` is a checkpoint directory or a registry name; fetches
    nothing, so every argument is checked before a download of minutes."""
    if Path(name).is_dir():
        if not (Path(name) / "config.json").exists():
            raise ValueError(f"--{what} {name} is a directory without config.json, not a checkpoint")
        return
    if "/" in name:
        raise ValueError(f"--{what} {name}: no such directory (give a checkpoint directory or a registry name)")
    from sglang_specsot.models import get_spec

    get_spec(name)  # a ValueError listing the known names


def check_models(target: str, draft: str | None) -> None:
    """`check_model` for the target and, if given, the draft: both before either is fetched."""
    check_model(target, "target")
    if draft:
        check_model(draft, "draft")


def resolve_model(name: str, what: str) -> str:
    """A checkpoint directory for a registry name (fetched if needed) or a directory."""
    check_model(name, what)
    if Path(name).is_dir():
        return str(Path(name).resolve())
    from sglang_specsot.models import fetch

    return str(fetch(name))


def pick_questions(rows: list[dict], limit: int | None, suitable: int | None, unsuitable: int | None) -> list[Question]:
    """The first `limit` rows, then the first `suitable` / `unsuitable` of each kind."""
    qs = [Question(int(r.get("id", i)), r["question"], bool(r.get("sot_suitable", True))) for i, r in enumerate(rows, 1)]
    qs = qs[:limit] if limit else qs
    if suitable is not None or unsuitable is not None:
        yes = [q for q in qs if q.suitable][: suitable if suitable is not None else len(qs)]
        no = [q for q in qs if not q.suitable][: unsuitable if unsuitable is not None else len(qs)]
        qs = [q for q in qs if q in yes or q in no]
    if not qs:
        raise ValueError("no questions selected; check --limit/--suitable/--unsuitable")
    return qs


def servers_fit(specs, target_bytes: int, draft_bytes: int, available: int | None) -> bool:
    """Whether every server in `specs` fits in memory at once: each holds the target's
    weights, a server with a draft model the draft's too, and SERVER_RUNTIME_BYTES beyond
    them, within MEMORY_SHARE of `available` (None: unknown, so one at a time)."""
    if available is None:
        return False
    need = sum(target_bytes + (draft_bytes if s.has_draft else 0) + SERVER_RUNTIME_BYTES for s in specs)
    return need <= MEMORY_SHARE * available


def plan_from_args(args) -> RunPlan:
    from sglang_specsot.data import load_questions

    questions = pick_questions(load_questions(args.questions), args.limit, args.suitable, args.unsuitable)
    check_models(args.target, args.draft)
    configs = select(matrix(bool(args.draft), baseline_algorithm(args.draft)), args.configs.split(",") if args.configs else None)
    sot_config = json.loads(args.sot_config) if args.sot_config else None
    if sot_config is not None:
        from sglang_specsot.sot import SoTConfig

        SoTConfig(**sot_config)  # validate now, not in every cell
    if args.system_prompt is not None and not args.system_prompt.strip():
        raise ValueError("--system-prompt is empty; give the system message's text, or leave the flag out")
    # Every argument is checked; only now the downloads.
    target = resolve_model(args.target, "target")
    draft = resolve_model(args.draft, "draft") if args.draft else None
    from sglang_specsot.speculative.token_map import resolve_map  # torch: only where a run starts

    token_map = resolve_map(args.token_map) if args.token_map else None
    if token_map and not draft:
        raise ValueError("--token-map cuts the draft model's LM head: give --draft too")
    specs = servers(draft, token_map=token_map, trace=args.trace)
    if args.one_at_a_time == "auto":
        needed = {specs[c.server] for c in configs}
        one = not servers_fit(needed, weight_file_bytes(target), weight_file_bytes(draft) if draft else 0, available_bytes())
    else:
        one = args.one_at_a_time == "yes"
    out = Path(args.out or f"benchmarks/e2e-{Path(args.target).name}" + (f"-{Path(args.draft).name}" if args.draft else ""))
    settings = Settings(args.max_tokens, args.timeout, sot_config, args.warm_prefixes, args.system_prompt)
    check_run_settings(out, {"target": args.target, "draft": args.draft, "dtype": args.dtype,
                             "questions": args.questions, "max_tokens": args.max_tokens,
                             "sot_config": sot_config,
                             # None, not False, when off: a run.json without the key still resumes
                             "warm_prefixes": args.warm_prefixes or None,
                             "warm_up": args.warm_up or None,
                             "system_prompt": args.system_prompt,
                             "token_map": args.token_map,
                             **({"trace": args.trace} if args.trace else {})})  # fmt: skip
    return RunPlan(target, args.dtype, specs, tuple(configs), tuple(questions), out, settings,
                   one, args.block, warm_up=args.warm_up)  # fmt: skip


def build_report(out: Path, quality: bool = True) -> dict:
    """report.json, report.md and plots/ from out/cells.jsonl (and judge.jsonl if present)."""
    from sglang_specsot.bench.judge import load_judgements
    from sglang_specsot.bench.plots import speedup_plot, timeline_plot
    from sglang_specsot.bench.quality import assess, controls
    from sglang_specsot.bench.goals import check, coverage_ceiling
    from sglang_specsot.bench.profile import profiles
    from sglang_specsot.bench.reader_report import reader_per_question, reader_rows
    from sglang_specsot.bench.report import SUBSETS, greedy_equality, lossless_speed, markdown, per_question, summarize
    from sglang_specsot.data import load_questions

    if not (out / CELLS_FILE).exists():
        raise ValueError(f"{out} has no {CELLS_FILE}; run `e2e --out {out}` first")
    settings = json.loads((out / RUN_FILE).read_text()) if (out / RUN_FILE).exists() else {}
    cells = load(out / CELLS_FILE)
    texts = {int(r.get("id", i)): r["question"] for i, r in enumerate(load_questions(settings.get("questions", "vicuna80")), 1)}
    scores, checks = [], []
    if quality:
        from sglang_specsot.models.embedding import SentenceEmbedder

        embedder = SentenceEmbedder()
        scores, checks = assess(cells, texts, embedder), controls(cells, embedder)
    rows = summarize(cells, scores, load_judgements(out), calibrated=load_judgements(out, "calibrated"))
    (out / "plots").mkdir(exist_ok=True)
    plots = [speedup_plot(rows, out / "plots" / f"speedup-{s}.png", s) for s in ("suitable", "unsuitable", "all")]
    plots += [timeline_plot(cells, qid, out / "plots" / f"timeline-q{qid}.png") for qid in sorted({k[0] for k in cells})]
    questions = per_question(cells, scores)
    ceiling, matched = coverage_ceiling(questions), coverage_ceiling(questions, "normal_matched")
    report = {"settings": settings, "summary": [asdict(r) for r in rows], "greedy_equality": greedy_equality(cells),
              "lossless_speed": lossless_speed(cells),
              "per_question": questions, "failed": [
                  {"question_id": c.question_id, "config": c.config, "reason": c.reason}
                  for c in cells.values() if c.status != "ok"],
              "plots": [str(p.relative_to(out)) for p in plots if p],
              "goals": [asdict(g) for g in check(rows, _judge_counts(out))], "coverage_ceiling": asdict(ceiling) if ceiling else None,
              "matched_ceiling": asdict(matched) if matched else None, "coverage_controls": [asdict(c) for c in checks],
              "profile": [asdict(p) for p in profiles(cells, SUBSETS)],
              "judge_controls": _judge_line(out),
              "reader": [asdict(r) for r in reader_rows(cells, texts, scores)],
              "reader_per_question": reader_per_question(cells, texts)}  # fmt: skip
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    table = markdown(rows)
    (out / "report.md").write_text(_report_md(settings, table, report))
    return report | {"table": table}


def _judge_counts(out: Path) -> bool:
    """Whether the run's judge passed its controls (judge_controls.json)."""
    from sglang_specsot.bench.judge_controls import load_controls

    found = load_controls(out)
    return found is not None and found[1].passes


def _judge_line(out: Path) -> str:
    """The judge's control line for beside the verdict table ("" when nothing was judged)."""
    from sglang_specsot.bench.judge import JUDGE_FILE
    from sglang_specsot.bench.judge_controls import describe
    from sglang_specsot.bench.judge_controls import load_controls

    found = load_controls(out)
    if found is None:
        return describe("", None) if (out / JUDGE_FILE).exists() else ""
    return describe(*found)


def _report_md(settings: dict, table: str, report: dict) -> str:
    from sglang_specsot.bench import goals, profile
    from sglang_specsot.bench.report import question_markdown

    lines = ["# SpecSoT end-to-end benchmark", "", f"Settings: `{json.dumps(settings)}`", "",
             report.get("judge_controls", ""), "", table, "",
             "Greedy equality of lossless pairs: " + ("this run is float32, so every pair must be equal."
              if settings.get("dtype") == "float32" else f"this run is {settings.get('dtype')}: "
              "batch shapes change the rounding, so pairs may differ; equality is required in float32."), ""]  # fmt: skip
    lines += [f"- {k}: {v['equal']}/{v['of']} equal; differ on {v['differ']}" for k, v in report["greedy_equality"].items()]
    if report.get("lossless_speed"):
        lines += ["", "Speed of lossless pairs per completion token (the second's s/token over the first's; "
                  "geometric mean over the questions both answered, then the range):", ""]
        lines += [f"- {k}: {v['per_token_speed']:.3f}x over {v['n']} questions ({v['min']:.3f}-{v['max']:.3f})"
                  for k, v in report["lossless_speed"].items()]
    lines += ["", f"Failed cells: {len(report['failed'])}"]
    lines += [f"- q{f['question_id']} {f['config']}: {f['reason']}" for f in report["failed"]]
    lines += ["", "Plots: " + ", ".join(f"[{p}]({p})" for p in report["plots"]), ""]
    lines += ["## Goals", "", goals.markdown([goals.Goal(**g) for g in report["goals"]]), ""]
    for key, measure in (("coverage_ceiling", "Coverage"), ("matched_ceiling", "Coverage 1:1")):
        if report.get(key):
            ceiling = report[key]
            against = [goals.Against(**a) for a in ceiling["configs"]]
            lines += [goals.ceiling_markdown(goals.Ceiling(**{**ceiling, "configs": against}), measure), ""]
    if report.get("coverage_controls"):
        from sglang_specsot.bench.quality import Control

        lines += [goals.controls_markdown([Control(**c) for c in report["coverage_controls"]]), ""]
    if report.get("reader"):
        from sglang_specsot.bench.reader_report import ReaderRow, markdown as reader_markdown

        lines += ["## What a reader sees", "", "Answers that went through SoT; those routed to the normal "
                  "answer are counted apart. Sentences are counted beyond each point's title.", "",
                  reader_markdown([ReaderRow(**r) for r in report["reader"]]), ""]  # fmt: skip
    lines += ["## Where a SoT answer's time goes", "", "Shares of the complete answer; `branches at once` = "
              "sum of branch durations / branch phase; `tokens / plain` counts the skeleton.", "",
              profile.markdown([profile.Profile(**p) for p in report["profile"]]), ""]  # fmt: skip
    lines += ["## Per question", "", question_markdown(report["per_question"])]
    return "\n".join(lines)
