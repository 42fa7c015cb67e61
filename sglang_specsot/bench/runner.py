"""Run the matrix: start servers, run every pending cell, append each to the JSONL.

Two schedules. Small models: every server up at once (idle ones sleep), each question asked
of every configuration in turn, the order rotated per question. Big models (several 1.5B
servers do not fit in memory): rounds over blocks of questions; in a round one server is up
and runs all its configurations on the block, the server order rotated per block. Ratios to
plain decoding then compare cells minutes apart rather than seconds apart; the blocks keep
that gap bounded.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from sglang_specsot.bench.cells import Question, Settings, Target, failed, run_cell
from sglang_specsot.bench.configs import CellConfig, ServerSpec
from sglang_specsot.bench.store import CELLS_FILE, OK, append, done_keys, load

logger = logging.getLogger(__name__)

# Custom logit processors on: server-side SoT and the frontend constrain the skeleton wherever
# the server can run it (serving/skeleton_constraint.constraint_runs), as users get it.
COMMON = ["--device", "cpu", "--attention-backend", "specsot_cpu", "--max-total-tokens", "8192",
          "--sleep-on-idle", "--enable-custom-logit-processor"]  # fmt: skip
# On CPU SGLang sizes its pools from the memory free at start-up, which other processes on a
# shared machine change; the KV pool is capped by --max-total-tokens anyway (8192 tokens of the
# 1.5B are ~235 MB), so every server may claim most of what is free when it starts, whether it
# runs alone or beside others (e2e.servers_fit decides whether they all fit). A smaller share
# for servers beside others would refuse a server whose weights alone exceed it, as the
# 1.5B + 0.5B pair's take about a third of what the first server leaves free.
MEM_FRACTION = "0.9"
START_RETRIES, RETRY_PAUSE = 1, 30
STATE_FILE = "server_state.jsonl"  # each SPECSOT server's /server_info "specsot" part, as it stopped
SERVER_ORDER = ("plain", "specsot", "specsot-ctx", "ngram", "standalone", "eagle3", "eagle")
# `warm_up`: asked of every fresh server, untimed, its answers thrown away. No question set
# holds this text or a negative id.
WARM_UP_QUESTION = Question(-1, "What are some tips for keeping houseplants healthy?", True)
WARM_UP_TOKENS = 96  # enough for a skeleton and a batch of branches to decode a few steps


@dataclass(frozen=True, slots=True)
class RunPlan:
    """Everything `e2e` decided from its arguments; the runner only executes it."""

    model_path: str
    dtype: str
    servers: dict[str, ServerSpec]
    configs: tuple[CellConfig, ...]
    questions: tuple[Question, ...]
    out: Path
    settings: Settings
    one_at_a_time: bool
    block: int
    startup_timeout: float = 900.0
    warm_up: bool = False  # one untimed cell of each kind on every fresh server (`_warm_up`)

    def pending(self) -> list[tuple[Question, CellConfig]]:
        done = done_keys(load(self.out / CELLS_FILE))
        return [(q, c) for q in self.questions for c in self.configs
                if c.runs_on(q.suitable) and (q.id, c.name) not in done]  # fmt: skip


def run(plan: RunPlan) -> int:
    """Run every pending cell; returns how many ran (failed ones included)."""
    todo = plan.pending()
    if not todo:
        return 0
    from tqdm import tqdm

    from sglang_specsot.frontend import chat_renderer

    render = chat_renderer(plan.model_path)
    (plan.out / "logs").mkdir(parents=True, exist_ok=True)
    with tqdm(total=len(todo), desc="cells", file=sys.stderr, dynamic_ncols=True) as bar:
        blocks = _chunks(plan.questions, plan.block) if plan.one_at_a_time else [plan.questions]
        for number, block in enumerate(blocks):
            block_todo = [(q, c) for q, c in todo if q in block]
            names = rotated(sorted({c.server for _, c in block_todo}, key=_server_rank), number)
            groups = [[n] for n in names] if plan.one_at_a_time else [names]
            for group in groups:
                _round(plan, [(q, c) for q, c in block_todo if c.server in group], group, render, bar)
    return len(todo)


def _round(plan: RunPlan, todo: list, names: list[str], render, bar) -> None:
    """Start `names`, run `todo` question by question (config order rotated), stop them."""
    pool = _Pool(plan, render)
    try:
        for name in names:
            pool.start(name)
        for i, question in enumerate(dict.fromkeys(q for q, _ in todo)):
            mine = [c for q, c in todo if q == question]
            for cfg in rotated(mine, i):
                reason = pool.ready(cfg.server)
                if reason:
                    cell = failed(cfg, question, reason)
                else:
                    cell = run_cell(cfg, question, pool.targets[cfg.server], plan.settings)
                append(plan.out / CELLS_FILE, cell)
                bar.set_postfix_str(f"q{question.id} {cfg.name} {cell.status}")
                bar.update(1)
    finally:
        pool.stop()


class _Pool:
    """The servers of one round. One found dead (on a shared machine the OOM killer picks the
    biggest process) is restarted once per round; after that its cells fail with the reason."""

    def __init__(self, plan: RunPlan, render) -> None:
        self.plan, self.render = plan, render
        self.servers: dict = {}
        self.targets: dict[str, Target] = {}
        self.broken: dict[str, str] = {}  # server name -> why its cells fail
        self.restarted: set[str] = set()

    def start(self, name: str) -> None:
        try:
            server = _start(self.plan, name)
        except (RuntimeError, TimeoutError, OSError) as exc:
            self.broken[name] = f"server {name} did not start: {str(exc).splitlines()[0]} (log {_log(self.plan, name)})"
            return
        self.servers[name], self.targets[name] = server, _target(server, self.plan.servers[name], self.render)
        if self.plan.warm_up:
            _warm_up(self.plan, name, self.targets[name])

    def ready(self, name: str) -> str | None:
        """None when `name` is up (restarting it if it died and was not restarted yet), else why not."""
        if name in self.broken:
            return self.broken[name]
        gone = self.targets[name].alive()
        if gone and name not in self.restarted:
            logger.warning("%s; restarting it", gone)
            self.restarted.add(name)
            self.servers.pop(name).stop()
            self.start(name)
            return self.broken.get(name)
        if gone:
            self.broken[name] = gone
        return self.broken.get(name)

    def stop(self) -> None:
        for name, server in self.servers.items():
            _keep_state(self.plan, name, server)
            server.stop()


def _keep_state(plan: RunPlan, name: str, server) -> None:
    """Append what a SPECSOT server's `/server_info` says of its policy (measured costs,
    acceptance, drafting runs and what they saved, catch-ups) to `STATE_FILE`, as it stands
    when the server stops: the choices behind a run's speeds, kept beside them. Other
    servers have no such state; a server that does not answer is noted in the log only."""
    try:
        states = server.get("/server_info", timeout=30.0).get("internal_states") or [{}]
    except (OSError, ValueError) as exc:  # URLError and timeouts are OSErrors; bad JSON a ValueError
        logger.warning("server %s: no /server_info at stop (%s)", name, exc)
        return
    specsot = states[0].get("specsot")
    if specsot is not None:
        line = {"server": name, "stopped": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "specsot": specsot}
        with open(plan.out / STATE_FILE, "a") as f:
            f.write(json.dumps(line) + "\n")


def _warm_up(plan: RunPlan, name: str, target: Target) -> None:
    """Ask WARM_UP_QUESTION once per kind of cell that runs on server `name`, untimed and not
    recorded. A fresh server's first SoT answer pays for batch shapes it has not run yet (a
    normal answer hardly does), which would otherwise land on whichever cell comes first;
    rotation spreads that cost over the configurations but not out of the ratios."""
    settings = replace(plan.settings, max_tokens=WARM_UP_TOKENS)
    kinds: set[str] = set()
    for cfg in plan.configs:
        if cfg.server != name or cfg.kind in kinds:
            continue
        kinds.add(cfg.kind)
        cell = run_cell(cfg, WARM_UP_QUESTION, target, settings)
        if cell.status != OK:  # the measured cells will meet and report whatever broke it
            logger.warning("warm-up of %s (%s) failed: %s", name, cfg.name, cell.reason)


def _server_rank(name: str) -> tuple[int, str]:
    """Round order in the first block: the headline pair (plain, then SpecSoT's server) first, so
    a run cut short still has it; later blocks rotate this order."""
    return (SERVER_ORDER.index(name) if name in SERVER_ORDER else len(SERVER_ORDER), name)


def _log(plan: RunPlan, name: str) -> Path:
    return plan.out / "logs" / f"{name}.log"


def _start(plan: RunPlan, name: str):
    """Start one server; a failed start is tried once more after a pause (memory on a shared
    machine comes and goes), then the error goes up to become the cells' reason."""
    from sglang_specsot.launch import ServerProcess

    args = server_args(plan.servers[name], plan.dtype)
    for attempt in range(1 + START_RETRIES):
        logger.info("starting server %s: %s", name, " ".join(args))
        server = ServerProcess(plan.model_path, args, dict(plan.servers[name].env), log_path=_log(plan, name),
                               startup_timeout=plan.startup_timeout)  # fmt: skip
        try:
            return server.start()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM while it starts: it is no one's to stop yet
            server.stop()
            raise
        except (RuntimeError, TimeoutError, OSError) as exc:
            if attempt == START_RETRIES:
                raise
            logger.warning("server %s did not start (%s); retrying in %ds", name, str(exc).splitlines()[0], RETRY_PAUSE)
            time.sleep(RETRY_PAUSE)


def server_args(spec: ServerSpec, dtype: str) -> list[str]:
    """A benchmark server's launch arguments: the shared flags, memory, dtype, then the config's own."""
    return COMMON + ["--mem-fraction-static", MEM_FRACTION, "--dtype", dtype] + list(spec.args)


def _target(server, spec: ServerSpec, render) -> Target:
    name = spec.name
    def alive() -> str | None:
        code = server.proc.poll()
        return None if code is None else f"server {name} exited with code {code} (log {server.log_path})"

    return Target(server.base_url, render, alive, constrain_skeleton=skeleton_constrained(spec))


def skeleton_constrained(spec: ServerSpec) -> bool:
    """Whether SoT on this server gets the skeleton constraint: the server-side rule, applied
    to the frontend too (it cannot see the server's environment, which delays sampling)."""
    from sglang_specsot.serving.skeleton_constraint import constraint_runs

    return constraint_runs(
        enable_custom_logit_processor="--enable-custom-logit-processor" in COMMON + list(spec.args),
        speculative_algorithm=spec.algorithm,
        disable_overlap_schedule="--disable-overlap-schedule" in spec.args,
        delay_sample=dict(spec.env).get("SGLANG_ENABLE_DELAY_SAMPLE") == "1",
    )


def _chunks(items: tuple, size: int) -> Iterator[tuple]:
    for i in range(0, len(items), max(1, size)):
        yield items[i : i + size]


def rotated(items: list, by: int) -> list:
    """`items` started at position `by` (so no configuration is always asked first)."""
    if not items:
        return []
    k = by % len(items)
    return items[k:] + items[:k]
