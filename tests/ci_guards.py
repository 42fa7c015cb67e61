"""Guards on the default tier: it fails when tests silently stop running.

A pytest plugin (loaded by tests/conftest.py). When a whole tier runs (no paths, `-k`, `-m`,
`--deselect` or `--lf` narrowing it), two things fail the run:

- **Fewer tests than the floor.** tests/tier_floor.json keeps, per tier, the number of tests
  collected and each module's count. A module that collects fewer (a marker change dropping it,
  a fixture error deselecting it, a rename) stops the run at collection, naming the module. When
  tests are removed on purpose, `--update-tier-floor` rewrites the file (and the diff shows it).
- **A skip not on the allow-list.** tests/skip_allowlist.json maps each node id allowed to skip
  to the reason; any other skip (a platform `skipif` that starts firing on a new machine) fails
  the run at the end, naming the test and its skip reason.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

HERE = Path(__file__).parent
FLOOR_FILE = HERE / "tier_floor.json"
ALLOWLIST_FILE = HERE / "skip_allowlist.json"


def module_counts(nodeids: list[str]) -> dict[str, int]:
    return dict(sorted(Counter(nodeid.split("::")[0] for nodeid in nodeids).items()))


def floor_violations(counts: dict[str, int], floor: dict) -> list[str]:
    """What the collected `counts` (per module) fall short of in `floor` ({total, modules})."""
    problems = [f"{module}: {counts.get(module, 0)} collected, floor {want}"
                for module, want in floor.get("modules", {}).items() if counts.get(module, 0) < want]  # fmt: skip
    total = sum(counts.values())
    if total < floor.get("total", 0):
        problems.insert(0, f"{total} tests collected, floor {floor['total']}")
    return problems


def unexpected_skips(skipped: dict[str, str], allowed: dict[str, str]) -> dict[str, str]:
    """The skipped node ids (id -> skip reason) that the allow-list does not name."""
    return {nodeid: why for nodeid, why in skipped.items() if nodeid not in allowed}


def whole_tier(config) -> bool:
    """True when nothing narrows the tier: what CI runs (scripts/test.sh with no arguments)."""
    opt = config.option
    narrowed = (opt.keyword or opt.markexpr or getattr(opt, "deselect", None) or getattr(opt, "lf", False)
                or getattr(opt, "last_failed", False))  # fmt: skip
    return not narrowed and config.args_source == pytest.Config.ArgsSource.TESTPATHS


class TierGuards:
    def __init__(self, config):
        self.config = config
        self.tier = config.getoption("--tier", "default")
        self.skipped: dict[str, str] = {}

    @pytest.hookimpl(trylast=True)  # after the tier's own selection (tests/conftest.py)
    def pytest_collection_modifyitems(self, config, items):
        counts = module_counts([item.nodeid for item in items])
        floors = _read(config.getoption("--tier-floor"))
        if config.getoption("--update-tier-floor"):
            floors[self.tier] = {"total": sum(counts.values()), "modules": counts}
            Path(config.getoption("--tier-floor")).write_text(json.dumps(floors, indent=1) + "\n")
            return
        if self.tier not in floors:
            return
        problems = floor_violations(counts, floors[self.tier])
        if problems:
            raise pytest.UsageError(
                f"the {self.tier} tier collected fewer tests than its floor ({config.getoption('--tier-floor')}):\n  "
                + "\n  ".join(problems)
                + "\nIf these tests were removed on purpose, rerun the whole tier with --update-tier-floor."
            )

    def pytest_runtest_logreport(self, report):
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.skipped[report.nodeid] = reason.removeprefix("Skipped: ")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        unexpected = unexpected_skips(self.skipped, _read(self.config.getoption("--skip-allowlist")))
        if not unexpected:
            return
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"{nodeid}: {why}" for nodeid, why in unexpected.items()]
        message = (f"{len(unexpected)} test(s) skipped that {self.config.getoption('--skip-allowlist')} does not "
                   "allow (add them with the reason, or make them run):\n  " + "\n  ".join(lines))  # fmt: skip
        if reporter is not None:
            reporter.write_line(message, red=True)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _read(path) -> dict:
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else {}


def pytest_addoption(parser):
    group = parser.getgroup("specsot tier guards")
    group.addoption("--tier-floor", default=str(FLOOR_FILE), help="the per-tier collection floor (JSON)")
    group.addoption("--skip-allowlist", default=str(ALLOWLIST_FILE), help="node ids allowed to skip, with reasons (JSON)")
    group.addoption("--update-tier-floor", action="store_true", help="rewrite the tier's floor from this collection")
    group.addoption("--no-tier-guards", action="store_true", help="run the whole tier without its guards")


def pytest_configure(config):
    if whole_tier(config) and not config.getoption("--no-tier-guards"):
        config.pluginmanager.register(TierGuards(config), "specsot-tier-guards")
