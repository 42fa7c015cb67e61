"""The OpenMP spin count the plugin leaves for SGLang's CPU schedulers (cpu/threads.py)."""

from __future__ import annotations

import os

from sglang_specsot.cpu.threads import (
    MARKER_ENV,
    NOT_SET,
    SET_BY_US,
    SET_BY_USER,
    SPIN_COUNT,
    keep_workers_spinning,
    spin_report,
)
from sglang_specsot.host import changes
from sglang_specsot.wiring import HOST_CHANGE_HOOKS
from tests.unit import cpu_checks


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


# register() in the CPU-engine process the unit tests share, started without either setting.
REGISTERED = cpu_checks.add("omp-spin-after-register", """
import os
from sglang_specsot.plugin import register
register()
result = {k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
""")  # fmt: skip


def _plugin_step(monkeypatch, **env: str) -> dict:
    """The settings after the plugin's host change omp-spin-on-cpu is applied in this
    process's environment plus `env` (it reads the environment when applied, as register()
    applies it)."""
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", MARKER_ENV):
        # Set, then delete: delenv of an unset name records nothing to restore, and the hook sets two.
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spin = next(c for c in changes.HOST_CHANGES if c.name == "omp-spin-on-cpu")
    monkeypatch.setattr(changes, "HOST_CHANGES", [spin])
    monkeypatch.setattr(changes, "_applied", [])
    changes.apply_host_changes({spin.name: HOST_CHANGE_HOOKS[spin.name]})
    return {k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}


def test_the_plugin_sets_it_on_sglangs_cpu_path_only(cpu_process, monkeypatch):
    ours = {"GOMP_SPINCOUNT": SPIN_COUNT, "OMP_WAIT_POLICY": None}
    assert cpu_process(REGISTERED) == ours
    assert _plugin_step(monkeypatch, SGLANG_USE_CPU_ENGINE="1") == ours
    assert _plugin_step(monkeypatch, SGLANG_USE_CPU_ENGINE="") == {"GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": None}
    assert _plugin_step(monkeypatch, SGLANG_USE_CPU_ENGINE="1", OMP_WAIT_POLICY="PASSIVE") == {
        "GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": "PASSIVE"
    }  # fmt: skip
