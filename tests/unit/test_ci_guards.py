"""The default tier's guards (tests/ci_guards.py) and time report (tests/ci_times.py) fail and
report as they should, on small suites run in-process by pytester."""

from __future__ import annotations

import json

import pytest

from tests.ci_guards import floor_violations, module_counts, unexpected_skips
from tests.ci_times import TimesRecorder, render

SUITE = {
    "test_a.py": "def test_one():\n    pass\n\ndef test_two():\n    pass\n",
    "test_b.py": "def test_three():\n    pass\n",
}


def test_floor_names_a_module_that_collects_fewer():
    counts = module_counts(["t/test_a.py::x", "t/test_a.py::y"])
    problems = floor_violations(counts, {"total": 3, "modules": {"t/test_a.py": 2, "t/test_b.py": 1}})
    assert problems == ["2 tests collected, floor 3", "t/test_b.py: 0 collected, floor 1"]
    assert floor_violations({"t/test_a.py": 2, "t/test_c.py": 5}, {"total": 2, "modules": {"t/test_a.py": 2}}) == []


def test_only_skips_off_the_allow_list_are_unexpected():
    skipped = {"t::a": "no fbgemm", "t::b": "one run is enough"}
    assert unexpected_skips(skipped, {"t::b": "why"}) == {"t::a": "no fbgemm"}


def _suite(pytester, allow: dict | None = None) -> None:
    pytester.makeini("[pytest]\ntestpaths = .\n")
    pytester.makeconftest('pytest_plugins = ["tests.ci_guards"]\n')
    pytester.makepyfile(**{name[:-3]: body for name, body in SUITE.items()})
    pytester.path.joinpath("allow.json").write_text(json.dumps(allow or {}))


def _run(pytester, *args):
    return pytester.runpytest_inprocess("--tier-floor", "floor.json", "--skip-allowlist", "allow.json", *args)


def test_a_deselected_module_fails_the_whole_tier(pytester):
    _suite(pytester)
    assert _run(pytester, "--update-tier-floor").ret == pytest.ExitCode.OK
    assert json.loads(pytester.path.joinpath("floor.json").read_text())["default"]["total"] == 3
    assert _run(pytester).ret == pytest.ExitCode.OK
    # A marker change that drops test_b.py: here the module stops being collected at all.
    pytester.makeconftest('pytest_plugins = ["tests.ci_guards"]\ncollect_ignore = ["test_b.py"]\n')
    result = _run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_b.py: 0 collected, floor 1*"])
    # A narrowed run (-k) is not the whole tier: no floor applies.
    assert _run(pytester, "-k", "one").ret == pytest.ExitCode.OK


def test_a_new_skip_fails_the_run_unless_allowed(pytester):
    _suite(pytester)
    pytester.makepyfile(test_c="import pytest\n\n@pytest.mark.skipif(True, reason='no fbgemm here')\n"
                               "def test_platform():\n    pass\n")  # fmt: skip
    result = _run(pytester)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*test_c.py::test_platform: no fbgemm here*"])
    _suite(pytester, allow={"test_c.py::test_platform": "this machine has no fbgemm"})
    assert _run(pytester).ret == pytest.ExitCode.OK


def test_the_time_report_sums_phases_per_module_and_lists_server_starts(tmp_path):
    recorder = TimesRecorder(tmp_path / "t.json")

    class Report:
        def __init__(self, nodeid, when, duration):
            self.nodeid, self.when, self.duration, self.outcome = nodeid, when, duration, "passed"

    for nodeid, when, s in [("m/a.py::x", "setup", 30.0), ("m/a.py::x", "call", 2.0), ("m/b.py::y", "call", 5.0)]:
        recorder.pytest_runtest_logreport(Report(nodeid, when, s))
    summary = recorder.summary()
    assert [row["module"] for row in summary["by_module"]] == ["m/a.py", "m/b.py"]
    assert summary["by_module"][0] == {"module": "m/a.py", "setup": 30.0, "call": 2.0, "total": 32.0}
    assert summary["slowest"][0] == {"nodeid": "m/a.py::x", "s": 32.0}
    assert any("m/b.py" in line for line in render(summary))
