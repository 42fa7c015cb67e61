"""Stage `replay` of the device check (issue 85, deliver 3): end-to-end latency on random weights
of real shapes, with a real model pair's acceptance replayed from a trace folder.

Per pair (Qwen2.5-1.5B or Qwen2.5-7B shapes with a Qwen2.5-0.5B-shaped draft, bf16, Triton
attention, CUDA graphs on; SGLang's dummy weights, so nothing is written or read but a config)
three engines live at once, each in its own process (gpu_replay_engines.py; their shapes
and arguments: gpu_replay_shapes.py): `plain` (the target alone), `STANDALONE` (SGLang's,
SGLANG_SIMULATE_ACC_LEN at the traced mean accept length) and `SPECSOT` (SGLANG_SPECSOT_REPLAY
on the trace). Five configurations run on them,
interleaved answer by answer, each answer on a flushed cache: plain, STANDALONE and SPECSOT
answer the normal answer; SoT-only (plain's engine) and SpecSoT (SPECSOT's) the skeleton, then
its branches at once, all at exactly the recorded lengths (gpu_replay_answers.py). A warm-up
pass over one answer per branch count first: compiles and captures stay out of the timing.
It records each pair's median seconds per answer, the ratios, and the accept lengths served
against those the trace promises; where its time runs out it records what finished.

    python3 scripts/gpu_stages.py replay --out F.jsonl [--smoke] [--traces DIR] [--pairs 1.5b,7b]
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import gpu_replay_answers as answers
from gpu_record import Recorder, blocker
from gpu_replay_answers import Limits, TraceFolder
from gpu_replay_engines import AnswerRun, EngineHost, Timed
from gpu_replay_shapes import (
    DEVICE_REPLAY,
    SMOKE_REPLAY,
    ReplayPlan,
    engine_specs,
    on_cpu,
    pair_dirs,
    pair_limits,
)

ROOT = Path(__file__).resolve().parents[1]
# The smoke's trace folder where benchmarks/ has none.
SMOKE_TRACES = ROOT / "tests" / "data" / "replay_traces"
# (configuration, engine, SoT answer?) in the order each answer runs them.
CONFIGS = (("plain", "plain", False), ("STANDALONE", "standalone", False), ("SPECSOT", "specsot", False),
           ("SoT-only", "plain", True), ("SpecSoT", "specsot", True))  # fmt: skip
# SPECSOT's replays serve the accept length the trace promises, within 10%.
ACCEPT_TOLERANCE = 0.1


# --- one pair --------------------------------------------------------------------------------


class PairRun:
    """One pair's engines, its warm-up, and its timed answers, configuration by configuration."""

    def __init__(self, rec: Recorder, name: str, folder: TraceFolder, plan: ReplayPlan, deadline: float) -> None:  # fmt: skip
        self.rec, self.name, self.folder, self.plan, self.deadline = rec, name, folder, plan, deadline  # fmt: skip
        self.limits = pair_limits(plan, name)
        self.engines: dict[str, EngineHost] = {}
        self.broken: dict[str, str] = {}  # engine -> what stopped it
        self.latencies: dict[str, list[float]] = {c: [] for c, _, _ in CONFIGS}
        self.served: dict[str, list[float]] = {c: [] for c, _, _ in CONFIGS}
        self.promised: dict[str, list[float]] = {c: [] for c, _, _ in CONFIGS}

    def start(self, root: Path) -> dict:
        max_bs = max(a.branches for a in self.folder.answers)
        dirs = pair_dirs(self.plan.pairs[self.name], self.plan.dtype, root)
        specs = engine_specs(self.folder, dirs, self.plan, max_bs)
        seconds = {}
        # One at a time: each sizes its pool from what is free at its start.
        for engine, (kwargs, env) in specs.items():
            started = time.monotonic()
            self.engines[engine] = EngineHost(f"{self.name} {engine}", kwargs, env)
            with self.failing(engine):
                self.engines[engine].wait_ready(
                    min(self.plan.engine_start_s, self.left())
                )
                seconds[engine] = round(time.monotonic() - started, 1)
        (standalone, simulate), (specsot, _) = specs["standalone"], specs["specsot"]
        return {
            "start_s": seconds,
            "simulated_accept_length": float(simulate["SGLANG_SIMULATE_ACC_LEN"]),
            "standalone_steps": standalone["speculative_num_steps"],
            "specsot_window": specsot["speculative_num_draft_tokens"],
            "specsot_depth": specsot["speculative_num_steps"],
        }

    def left(self) -> float:
        return self.deadline - time.monotonic()

    @contextlib.contextmanager
    def failing(self, engine: str):
        """An engine that fails (not one the deadline stops) is recorded and left out from
        then on: the other configurations still measure (SGLang's STANDALONE needs its JIT
        tree kernels on a GPU; SPECSOT does not)."""
        try:
            yield
        except TimeoutError:  # the deadline: the pair stops here
            raise
        # Its own error, or its process died.
        except (RuntimeError, EOFError, OSError) as exc:
            self.broken[engine] = blocker(exc)
            self.rec.emit(f"{self.name} {engine}: left out: {self.broken[engine]}", pair=self.name,
                          engine=engine, error=self.broken[engine])  # fmt: skip

    def run_answer(self, answer, tag: str, limits: Limits) -> dict[str, Timed]:
        """Every configuration once on `answer`, each on a flushed cache."""
        timed = {}
        for config, engine, sot in CONFIGS:
            host = self.engines[engine]
            with self.failing(engine):
                if engine not in self.broken:
                    host.call("flush", timeout_s=self.left())
                    run = AnswerRun(answer, tag, sot, limits)
                    timed[config] = host.call("time", run, timeout_s=self.left())
        return timed

    def warm_up(self) -> float:
        """One answer per branch count on every configuration, cut to `plan.warmup_max_new`
        tokens; its seconds."""
        started, limits = time.monotonic(), self.limits.capped(self.plan.warmup_max_new)
        for i, answer in enumerate(answers.warmup_answers(self.folder.answers)):
            self.run_answer(answer, f"w{i}", limits)
        return round(time.monotonic() - started, 1)

    def measure(self) -> int:
        """Timed answers until `plan.answers` or the time left would not hold another round."""
        longest = 0.0
        to_time = answers.measured_answers(self.folder.answers, self.plan.answers)
        for i, answer in enumerate(to_time):
            # Another round must fit; the deadline keeps the shutdown's time already.
            if self.left() < longest * 1.5:
                return i
            started = time.monotonic()
            timed = self.run_answer(answer, f"m{i}", self.limits)
            longest = max(longest, time.monotonic() - started)
            self.record_answer(i, answer, timed)
        return self.plan.answers

    def record_answer(self, i: int, answer, timed: dict[str, Timed]) -> None:
        for config, t in timed.items():
            self.latencies[config].append(t.seconds)
            self.served[config] += t.accept_lengths
            self.promised[config] += self.promised_accept(config, answer, t)
        seconds = {c: round(t.seconds, 4) for c, t in timed.items()}
        self.rec.emit(f"{self.name} answer {i} ({answer.question_id}, {answer.branches} branches): {seconds}",
                      pair=self.name, answer=i, question_id=answer.question_id, seconds=seconds,
                      accept={c: t.accept_lengths for c, t in timed.items()})  # fmt: skip

    def promised_accept(self, config: str, answer, t: Timed) -> list[float]:
        """What the trace says the replaying configurations' requests should report."""
        if config not in ("SPECSOT", "SpecSoT"):
            return []
        normal = config == "SPECSOT"
        rids = (
            [answer.specsot_rid]
            if normal
            else [answer.skeleton_rid, *answer.branch_rids]
        )
        trace = self.folder.trace
        return [
            answers.served_accept_length(trace.get(r, []), m["completion_tokens"])
            for r, m in zip(rids, t.metas)
        ]

    def server_accept(self) -> dict:
        live = [e for e in ("standalone", "specsot") if e not in self.broken]
        return {
            e: self.engines[e].call("accept", timeout_s=max(self.left(), 5))
            for e in live
        }

    def stop(self) -> None:
        for host in self.engines.values():
            host.stop()


def accept_report(run: PairRun, simulated: float) -> tuple[dict, str | None]:
    """Mean accept lengths served against promised, and why the replay did not hold, or None."""
    report, problem = {}, None
    for config in ("STANDALONE", "SPECSOT", "SpecSoT"):
        promised = run.promised[config] or (
            [simulated] if config == "STANDALONE" else []
        )
        s, p = _mean(run.served[config]), _mean(promised)
        report[config] = {"served": s, "promised": p}
        # STANDALONE's simulated length is drawn step by step: reported, not checked.
        if config != "STANDALONE" and (
            s is None or p is None or abs(s - p) > ACCEPT_TOLERANCE * p
        ):
            problem = (
                problem
                or f"{config} served accept length {s} where the trace promises {p}"
            )
    return report, problem


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 3) if values else None


def run_pair(
    rec: Recorder, name: str, folder: TraceFolder, plan: ReplayPlan, deadline: float
) -> str | None:
    """One pair end to end, recorded; why it fell short (a blocker, too few answers), or None."""
    run = PairRun(rec, name, folder, plan, deadline)
    try:
        with tempfile.TemporaryDirectory(prefix=f"specsot-replay-{name}-") as tmp:
            started = run.start(Path(tmp))
            rec.emit(
                f"{name}: engines ready {started['start_s']}", pair=name, **started
            )
            warm_s = run.warm_up()
            timed = run.measure()
            accept, problem = accept_report(run, started["simulated_accept_length"])
            server = run.server_accept()
    except Exception as exc:
        # The answers that finished before it stopped.
        partial = answers.summary(run.latencies)
        rec.emit(
            f"{name}: {blocker(exc)}", pair=name, error=blocker(exc), partial=partial
        )
        return f"{name}: {blocker(exc)}"
    finally:
        run.stop()
    report = answers.summary(run.latencies)
    said = {c: f"{a['served']} of {a['promised']}" for c, a in accept.items()}
    rec.emit(f"{name}: {json.dumps(report)}; accept length served of promised {said}", pair=name, summary=report, accept=accept, server_accept=server,
             warmup_s=warm_s, answers_timed=timed, left_out=run.broken, shape=asdict(plan.pairs[name]))  # fmt: skip
    short = (
        f"time ran out after {timed} of {plan.answers} answers"
        if timed < plan.answers
        else None
    )
    why = [
        w
        for w in (problem, short, *(f"{e} engine: {b}" for e, b in run.broken.items()))
        if w
    ]
    return f"{name}: {'; '.join(why)}" if why else None


def stage_replay(
    rec: Recorder, smoke: bool, limit_s: float, traces: Path | None, pairs: list[str]
) -> None:
    plan = SMOKE_REPLAY if smoke else DEVICE_REPLAY
    unknown = [p for p in pairs if p not in plan.pairs]
    if unknown:
        raise ValueError(f"--pairs names {unknown}; known: {', '.join(plan.pairs)}")
    # Resolved: the engines' schedulers read the trace by this path.
    folder = answers.load_trace_folder((traces or default_traces(smoke)).resolve())
    rec.emit(f"traces {folder.path}: {len(folder.answers)} questions, {len(folder.trace)} traced requests",
             traces=str(folder.path), questions=len(folder.answers), plan=_plan_record(plan))  # fmt: skip
    if smoke and not on_cpu():
        planned = dry_run(folder, plan, pairs)
        rec.finish("ok", None, f"smoke: engines not started (SPECSOT_GPU_SMOKE_ENGINES=1 starts them); "
                   f"{planned} requests planned", smoke=True, planned=planned)  # fmt: skip
        return
    deadline = rec.started + limit_s - plan.stop_reserve_s
    problems = []
    for name in pairs:
        if deadline - time.monotonic() < plan.start_reserve_s:
            problems.append(
                f"{name}: not started, {deadline - time.monotonic():.0f} s left"
            )
            rec.emit(problems[-1], pair=name, skipped=True)
            continue
        problem = run_pair(rec, name, folder, plan, deadline)
        if problem:
            problems.append(problem)
    rec.finish(
        "ok" if not problems else "failed",
        "; ".join(problems) or None,
        smoke=smoke,
        pairs=pairs,
    )


def dry_run(folder: TraceFolder, plan: ReplayPlan, pairs: list[str]) -> int:
    """Every pair's configs and engine arguments and every answer's requests, with nothing
    started: the requests planned (a skeleton's output stands in as its prompt again)."""
    planned = 0
    with tempfile.TemporaryDirectory(prefix="specsot-replay-dry-") as tmp:
        for name in pairs:
            limits = pair_limits(plan, name)
            engine_specs(
                folder,
                pair_dirs(plan.pairs[name], plan.dtype, Path(tmp) / name),
                plan,
                max_bs=1,
            )
            for i, answer in enumerate(
                answers.measured_answers(folder.answers, plan.answers)
            ):
                answers.normal_request(answer, f"m{i}", limits)
                skeleton = answers.skeleton_request(answer, f"m{i}", limits)
                planned += 2 + len(
                    answers.branch_requests(answer, f"m{i}", limits, skeleton.input_ids)
                )
    return planned


def default_traces(smoke: bool) -> Path:
    """The newest benchmarks/traces-* folder; the smoke's own small one where there is none."""
    try:
        return answers.newest_trace_folder(ROOT / "benchmarks")
    except ValueError:
        if smoke:
            return SMOKE_TRACES
        raise


def _plan_record(plan: ReplayPlan) -> dict:
    return {
        "dtype": plan.dtype,
        "answers": plan.answers,
        "max_new": plan.max_new,
        "max_prompt": plan.max_prompt,
    }
