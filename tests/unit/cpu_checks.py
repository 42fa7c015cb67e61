"""One fresh SGLang CPU-engine interpreter for the unit checks that need SGLang in a process of
their own, instead of one interpreter each: importing SGLang costs ~12 s a process on the
slower machines.

A test module adds its checks when it is imported (`add`); the first test that asks for an
outcome (the `cpu_process` fixture) runs every check added in one subprocess: first those that
look at SGLang before the plugin registers (`before_plugin`, which must not register it), then
the rest, each group in the order added. A check is Python code run in a namespace of its own,
with `TINY_MODEL` (a tiny checkpoint's directory) set; what it leaves in `result` comes back as
JSON, and an exception comes back as its traceback and fails only its own test. A check that
changes SGLang's module state for itself puts it back, so the checks after it meet SGLang as
the plugin leaves it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 600
# The default paths are under test: SGLang's CPU engine, `sgl_kernel` as the import hook
# chooses it, and no OpenMP settings of the caller's.
_UNSET = ("SGLANG_SPECSOT_CPU_KERNELS", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "SGLANG_SPECSOT_SET_GOMP_SPINCOUNT")

_CHECKS: dict[str, tuple[bool, str]] = {}  # name -> (before_plugin, code), in the order added

_RUNNER = """
import json, sys, traceback
spec = json.load(sys.stdin)
outcomes = {}
for name, code in spec["checks"]:
    namespace = {"__name__": "__check__", "TINY_MODEL": spec["tiny_model"]}
    try:
        exec(compile(code, name, "exec"), namespace)
        outcomes[name] = {"result": namespace.get("result")}
    except Exception:
        outcomes[name] = {"error": traceback.format_exc()}
print(json.dumps(outcomes))
"""


def add(name: str, code: str, before_plugin: bool = False) -> str:
    """Add a check (once per name, as a module is imported once); returns its name."""
    assert _CHECKS.get(name, (before_plugin, code)) == (before_plugin, code), f"two checks named {name!r}"
    _CHECKS[name] = (before_plugin, code)
    return name


def run(tiny_model: str, cwd: Path) -> dict[str, dict]:
    """Every check added, in one subprocess from `cwd` (nothing may depend on the repository
    being the working directory): name -> {"result": ...} or {"error": traceback}."""
    ordered = [(name, code) for group in (True, False) for name, (before, code) in _CHECKS.items() if before == group]
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER], input=json.dumps({"checks": ordered, "tiny_model": tiny_model}),
        cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip(), f"exit {proc.returncode}\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
