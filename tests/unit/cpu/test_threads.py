"""The OpenMP spin count the plugin leaves for SGLang's CPU schedulers (cpu/threads.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sglang_specsot.cpu.threads import (
    MARKER_ENV,
    NOT_SET,
    SET_BY_US,
    SET_BY_USER,
    SPIN_COUNT,
    keep_workers_spinning,
    spin_report,
)


def test_an_unset_environment_gets_the_spin_count_and_says_so():
    env: dict[str, str] = {}
    assert spin_report(env)["source"] == NOT_SET
    assert keep_workers_spinning(env) == SET_BY_US
    assert env["GOMP_SPINCOUNT"] == SPIN_COUNT
    assert spin_report(env) == {"GOMP_SPINCOUNT": SPIN_COUNT, "OMP_WAIT_POLICY": None, "source": SET_BY_US}
    # Again (a scheduler runs the plugin too, with the launcher's environment): still ours.
    assert keep_workers_spinning(env) == SET_BY_US and env["GOMP_SPINCOUNT"] == SPIN_COUNT


def test_a_users_choice_is_left_alone():
    for env in ({"GOMP_SPINCOUNT": "0"}, {"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": SPIN_COUNT}):
        before = dict(env)
        assert keep_workers_spinning(env) == SET_BY_USER
        assert env == before and MARKER_ENV not in env
        assert spin_report(env)["source"] == SET_BY_USER


def _registered_env(extra: dict[str, str]) -> dict:
    code = (
        "import json, os; from sglang_specsot.plugin import register; register();"
        "print(json.dumps({k: os.environ.get(k) for k in ('GOMP_SPINCOUNT', 'OMP_WAIT_POLICY')}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", MARKER_ENV)}
    out = subprocess.run([sys.executable, "-c", code], check=True, env={**env, **extra}, timeout=600,
                         capture_output=True, text=True).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def test_the_plugin_sets_it_on_sglangs_cpu_path_only():
    assert _registered_env({"SGLANG_USE_CPU_ENGINE": "1"}) == {"GOMP_SPINCOUNT": SPIN_COUNT, "OMP_WAIT_POLICY": None}
    assert _registered_env({"SGLANG_USE_CPU_ENGINE": ""}) == {"GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": None}
    assert _registered_env({"SGLANG_USE_CPU_ENGINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}) == {
        "GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": "PASSIVE"
    }  # fmt: skip
