"""Where a test run's time went: per module and phase, the slowest tests, every server start.

A pytest plugin (loaded by tests/conftest.py). With `--times-report FILE` (scripts/test.sh passes
it, so every CI run has one) it prints a summary at the end of the run and writes the same data
to FILE as JSON. The summary is printed even when the run is cut short (an outer `timeout`
sends SIGINT, after which pytest still runs its terminal summary), so a run that overran says
where its time went.

SPECSOT_TEST_TIMES=FILE also appends each phase's line as it ends (a run killed outright still
leaves those).
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

TIMES_ENV = "SPECSOT_TEST_TIMES"
SLOWEST = 25


@dataclass(frozen=True)
class PhaseTime:
    nodeid: str
    when: str  # "setup" | "call" | "teardown"
    s: float
    outcome: str


@dataclass(frozen=True)
class ServerStart:
    nodeid: str  # the test whose setup or call started it
    model: str
    s: float
    ok: bool


class TimesRecorder:
    """Collects phase times and server starts as they happen; summarises at the end."""

    def __init__(self, report_path: Path | None):
        self.report_path = report_path
        self.phases: list[PhaseTime] = []
        self.starts: list[ServerStart] = []
        self.current = ""
        self.t0 = time.monotonic()
        self._unpatch = None

    # -- hooks ---------------------------------------------------------------------------------
    def pytest_unconfigure(self, config):
        if self._unpatch:
            self._unpatch()

    def pytest_runtest_logstart(self, nodeid, location):
        self.current = nodeid

    def pytest_runtest_logreport(self, report):
        phase = PhaseTime(report.nodeid, report.when, round(report.duration, 3), report.outcome)
        self.phases.append(phase)
        path = os.environ.get(TIMES_ENV)
        if path:
            with open(path, "a") as out:
                out.write(json.dumps(asdict(phase)) + "\n")

    def pytest_terminal_summary(self, terminalreporter):
        if self.report_path is None or not self.phases:
            return
        summary = self.summary()
        for line in render(summary):
            terminalreporter.write_line(line)
        self.report_path.parent.mkdir(parents=True, exist_ok=True)
        self.report_path.write_text(json.dumps(summary, indent=1) + "\n")
        terminalreporter.write_line(f"times: written to {self.report_path}")

    # -- the summary ---------------------------------------------------------------------------
    def summary(self) -> dict:
        modules: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        per_test: dict[str, float] = defaultdict(float)
        for phase in self.phases:
            module = phase.nodeid.split("::")[0]
            modules[module][phase.when] += phase.s
            per_test[phase.nodeid] += phase.s
        by_module = sorted(
            ({"module": m, **{k: round(v, 1) for k, v in ph.items()}, "total": round(sum(ph.values()), 1)}
             for m, ph in modules.items()),
            key=lambda row: -row["total"],
        )  # fmt: skip
        slowest = sorted(per_test.items(), key=lambda kv: -kv[1])[:SLOWEST]
        return {
            "wall_s": round(time.monotonic() - self.t0, 1),
            "tests": len(per_test),
            "by_module": by_module,
            "slowest": [{"nodeid": n, "s": round(s, 1)} for n, s in slowest],
            "server_starts": [asdict(start) for start in self.starts],
        }


def render(summary: dict) -> list[str]:
    """The summary as the lines a CI log shows."""
    lines = [f"== times: {summary['tests']} tests, {summary['wall_s'] / 60:.1f} min of pytest =="]
    lines.append(f"{'total s':>8} {'setup':>7} {'call':>7} {'teardown':>8}  module")
    for row in summary["by_module"]:
        lines.append(f"{row['total']:8.1f} {row.get('setup', 0):7.1f} {row.get('call', 0):7.1f} "
                     f"{row.get('teardown', 0):8.1f}  {row['module']}")  # fmt: skip
    lines.append(f"-- slowest {len(summary['slowest'])} tests (setup + call + teardown) --")
    lines += [f"{row['s']:8.1f}  {row['nodeid']}" for row in summary["slowest"]]
    starts = summary["server_starts"]
    lines.append(f"-- {len(starts)} server starts, {sum(s['s'] for s in starts):.0f} s in all --")
    lines += [f"{s['s']:8.1f}  {'ok ' if s['ok'] else 'err'} {s['model']}  ({s['nodeid']})" for s in starts]
    return lines


def _time_server_starts(recorder: TimesRecorder):
    """Wrap ServerProcess.start (every test server goes through it) to time each start."""
    from sglang_specsot.launch import ServerProcess

    original = ServerProcess.start

    def start(self):
        t0, ok = time.monotonic(), False
        try:
            result = original(self)
            ok = True
            return result
        finally:
            recorder.starts.append(
                ServerStart(recorder.current, Path(self.model_path).name, round(time.monotonic() - t0, 1), ok)
            )

    ServerProcess.start = start

    def unpatch():
        ServerProcess.start = original

    return unpatch


def pytest_addoption(parser):
    parser.addoption(
        "--times-report", default=None, metavar="FILE",
        help="print where the run's time went (per module and phase, the slowest tests, server "
        "starts) and write it to FILE as JSON; scripts/test.sh passes it",
    )  # fmt: skip


def pytest_configure(config):
    path = config.getoption("--times-report")
    recorder = TimesRecorder(Path(path) if path else None)
    recorder._unpatch = _time_server_starts(recorder)
    config.pluginmanager.register(recorder, "specsot-times")
