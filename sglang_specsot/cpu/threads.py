"""Keep the OpenMP workers of an SGLang CPU server awake between the ops of one step.

torch's x86 wheels run their intra-op pool on GNU OpenMP (libgomp). After each parallel
region a libgomp worker spins GOMP_SPINCOUNT times (300,000 by default, a few milliseconds;
none with OMP_WAIT_POLICY=PASSIVE) and then sleeps on a futex; the next region must wake it.
A decode step on CPU is hundreds of small parallel regions (each layer's products, the
attention's gathers, norms) separated by Python: SGLang's layer code, and between the
forwards of a speculative step the tree, the budget policy and the scheduler's bookkeeping.
Wherever a gap outlasts the spin, the region after it waits for a wake-up, and a
speculative step, with more Python between its forwards, loses more to it than plain
decoding does (docs/benchmarks.md). So the spin count is raised to 10M.

10M spins last about a tenth of a second: a worker spins that long after the server's last
step and then sleeps, so an idle server costs nothing and a second server beside it (the
benchmarks run two) is not starved for more than that. Two processes that compute at the
same time on the same cores should not spin: set OMP_WAIT_POLICY=PASSIVE for them.

libgomp reads the variable once, when it is loaded (on `import torch`), so it must be in the
environment before SGLang starts its scheduler processes; the plugin sets it in the launching
process (host change `omp-spin-on-cpu`, host/changes.py), and the schedulers inherit it. A
value the user set (GOMP_SPINCOUNT, or OMP_WAIT_POLICY, which sets its own spin count) is left
as it is.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

SPIN_ENV = "GOMP_SPINCOUNT"
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
# Where the step time stops improving: longer spins gain nothing (docs/benchmarks.md).
SPIN_COUNT = "10M"
# Inherited with the spin count, so a scheduler can tell ours from a user's.
MARKER_ENV = "SGLANG_SPECSOT_SET_GOMP_SPINCOUNT"
SET_BY_US, SET_BY_USER, NOT_SET = "sglang-specsot", "user", "libgomp default"


def keep_workers_spinning(environ: MutableMapping[str, str] | None = None) -> str:
    """Set GOMP_SPINCOUNT for the processes this one starts, unless the user chose a wait
    policy; returns who set it. Idempotent."""
    env = os.environ if environ is None else environ
    if _source(env) == NOT_SET:
        env[SPIN_ENV] = SPIN_COUNT
        env[MARKER_ENV] = "1"
    return _source(env)


def spin_report(environ: MutableMapping[str, str] | None = None) -> dict:
    """What /server_info shows: the spin count and wait policy this process started with."""
    env = os.environ if environ is None else environ
    return {SPIN_ENV: env.get(SPIN_ENV), WAIT_POLICY_ENV: env.get(WAIT_POLICY_ENV), "source": _source(env)}


def _source(env: MutableMapping[str, str]) -> str:
    if env.get(MARKER_ENV) == "1":
        return SET_BY_US
    return SET_BY_USER if SPIN_ENV in env or WAIT_POLICY_ENV in env else NOT_SET
