"""The test tiers: `--tier` keeps exactly the tests of its tier, and the default tier keeps the
user-facing paths that tests/README.md promises it covers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest

ROOT = Path(__file__).resolve().parents[2]


class _Item:
    def __init__(self, name: str, long: bool) -> None:
        self.name, self.long, self.timeout = name, long, None
        self.nodeid = f"tests/unit/test_{name}.py::test_{name}"  # the hook also orders by node id

    def get_closest_marker(self, name: str):
        if name == "timeout":
            return self.timeout
        return object() if name == "long" and self.long else None

    def add_marker(self, mark) -> None:
        assert mark.name == "timeout", mark
        self.timeout = mark


def _select(tier: str) -> tuple[list[str], list[str]]:
    items = [_Item("unit", False), _Item("soak", True), _Item("parity", False)]
    dropped: list[str] = []
    config = SimpleNamespace(
        getoption=lambda name: tier,
        hook=SimpleNamespace(pytest_deselected=lambda items: dropped.extend(i.name for i in items)),
    )
    conftest.pytest_collection_modifyitems(config, items)
    return [i.name for i in items], dropped


@pytest.mark.parametrize(
    ("tier", "kept", "dropped"),
    [("default", ["unit", "parity"], ["soak"]), ("long", ["soak"], ["unit", "parity"]), ("all", ["unit", "soak", "parity"], [])],
)
def test_a_tier_keeps_its_own_tests_and_reports_the_rest_deselected(tier, kept, dropped):
    assert _select(tier) == (kept, dropped)


def test_long_tier_tests_get_the_long_timeout_and_default_ones_the_ini_one():
    items = [_Item("unit", False), _Item("soak", True)]
    config = SimpleNamespace(getoption=lambda name: "all", hook=None)
    conftest.pytest_collection_modifyitems(config, items)
    assert items[0].timeout is None and items[1].timeout.args == (conftest.LONG_TIER_TIMEOUT,)


def _collected_by_default() -> list[str]:
    """The integration node ids, parameters included, the default tier collects."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "--tier", "default", "tests/integration"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [line.strip() for line in out.stdout.splitlines() if "::" in line]


# A server's parameter id named in a default-tier cell, e.g. `smollm2-chain-overlap-qlen_only_layout`:
# the configuration the row counts on (a draft model on the CPU layout), not only its test function.
PARAM_ID = re.compile(r"^[a-z0-9_]+(?:-[a-z0-9_]+)+$")


def _paths_table() -> list[tuple[str, list[str], list[str], list[str]]]:
    """tests/README.md's table: (path, default-tier node ids, long-tier node ids, default-tier
    parameter ids)."""
    rows = []
    for line in (ROOT / "tests" / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and "`tests/" in line:
            ids = lambda cell: [part for part in cell.split("`")[1::2] if part.startswith("tests/")]  # noqa: E731
            params = [part for part in cells[1].split("`")[1::2] if PARAM_ID.match(part)]
            rows.append((cells[0], ids(cells[1]), ids(cells[2]), params))
    return rows


def test_tests_readme_names_real_tests_in_the_tier_it_says():
    rows = _paths_table()
    assert len(rows) >= 8, "tests/README.md lost its table of user-facing paths"
    collected = _collected_by_default()
    default = {nodeid.split("[")[0] for nodeid in collected}
    for path, in_default, in_long, params in rows:
        assert in_default, f"{path}: no test of the default tier"
        for nodeid in in_default:
            assert nodeid in default, f"{path}: {nodeid} is not collected by the default tier"
        files = {nodeid.split("::")[0] for nodeid in in_default}
        for param in params:  # a whole parameter id, as `pytest --co` prints it in brackets
            named = {n.split("[", 1)[1][:-1] for n in collected if "[" in n and n.split("::")[0] in files}
            assert param in named, f"{path}: no default-tier test of its files runs `{param}`"
        for nodeid in in_long:
            file, name = nodeid.split("::")
            assert f"def {name}(" in (ROOT / file).read_text(), f"{path}: {nodeid} does not exist"
