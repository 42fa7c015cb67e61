"""The test tiers: `--tier` keeps exactly the tests of its tier, and the default tier keeps the
user-facing paths that tests/README.md promises it covers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest

ROOT = Path(__file__).resolve().parents[2]


class _Item:
    def __init__(self, name: str, long: bool) -> None:
        self.name, self.long = name, long

    def get_closest_marker(self, name: str):
        return object() if name == "long" and self.long else None


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


def _collected_by_default() -> set[str]:
    """The integration test functions (node ids without parameters) the default tier collects."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "--tier", "default", "tests/integration"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {line.split("[")[0] for line in out.stdout.splitlines() if "::" in line}


def _paths_table() -> list[tuple[str, list[str], list[str]]]:
    """tests/README.md's table: (path, default-tier node ids, long-tier node ids)."""
    rows = []
    for line in (ROOT / "tests" / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and "`tests/" in line:
            ids = lambda cell: [part for part in cell.split("`")[1::2] if part.startswith("tests/")]  # noqa: E731
            rows.append((cells[0], ids(cells[1]), ids(cells[2])))
    return rows


def test_tests_readme_names_real_tests_in_the_tier_it_says():
    rows = _paths_table()
    assert len(rows) >= 8, "tests/README.md lost its table of user-facing paths"
    default = _collected_by_default()
    for path, in_default, in_long in rows:
        assert in_default, f"{path}: no test of the default tier"
        for nodeid in in_default:
            assert nodeid in default, f"{path}: {nodeid} is not collected by the default tier"
        for nodeid in in_long:
            file, name = nodeid.split("::")
            assert f"def {name}(" in (ROOT / file).read_text(), f"{path}: {nodeid} does not exist"
