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

import logging
import os
from collections.abc import Callable, MutableMapping

logger = logging.getLogger(__name__)

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


# -- SGLANG_CPU_OMP_THREADS_BIND where SGLang does not bind ----------------------------------

BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"


def parse_cpulist(text: str) -> list[int]:
    """The CPUs of a Linux cpulist ("0-3,8", as SGLANG_CPU_OMP_THREADS_BIND gives one rank);
    ValueError naming the text."""
    cpus: list[int] = []
    try:
        for part in text.replace(" ", "").split(","):
            first, _, last = part.partition("-")
            cpus.extend(range(int(first), int(last or first) + 1))
    except ValueError:
        raise ValueError(f"{BIND_ENV}: {text!r} is not a list of cores such as '0-3,8'") from None
    if not cpus:
        raise ValueError(f"{BIND_ENV}: {text!r} names no core")
    return sorted(set(cpus))


def bind_process(cpus: list[int]) -> list[int]:
    """Pin every thread of this process to `cpus` (of those it may use) and size torch's
    intra-op pool to them; the CPUs bound. Threads started later inherit the affinity."""
    import torch

    allowed = sorted(set(cpus) & os.sched_getaffinity(0))
    if not allowed:
        raise ValueError(f"{BIND_ENV}: cores {cpus} are not among this process's {sorted(os.sched_getaffinity(0))}")
    pinned: set[str] = set()
    for _ in range(8):  # until a pass finds no thread started by one not yet pinned
        tasks = set(os.listdir("/proc/self/task")) - pinned
        if not tasks:
            break
        for task in tasks:
            try:
                os.sched_setaffinity(int(task), allowed)
            except (ProcessLookupError, PermissionError):
                pass  # a thread that ended meanwhile
        pinned |= tasks
    torch.set_num_threads(len(allowed))
    return allowed


def threads_bind_around(original, *args, sglang_binds: Callable[[], bool] | None = None, **kwargs):
    """AROUND hook on SGLang's `_init_cpu_threads_env` (distributed/bootstrap.py:277).

    SGLang binds a CPU scheduler's OpenMP threads to its rank's SGLANG_CPU_OMP_THREADS_BIND
    cores only on AMX or arm64 CPUs, through sgl-kernel; elsewhere it logs a warning and every
    scheduler keeps all cores, so two replicas or DP ranks on one machine, each with a pool as
    wide as the machine and spinning workers (GOMP_SPINCOUNT), take turns on every core. Where
    the user set the variable and SGLang did not bind, the scheduler's threads are pinned to its
    rank's cores here and torch's pool sized to them."""
    result = original(*args, **kwargs)
    cpulist = kwargs.get("local_omp_cpuid")
    binds = sglang_binds if sglang_binds is not None else _sglang_binds_cpu_threads
    if os.environ.get(BIND_ENV) and cpulist and not binds():
        bound = bind_process(parse_cpulist(str(cpulist)))
        logger.info("%s: this scheduler's threads pinned to cores %s, torch's pool at %d thread(s) "
                    "(SGLang binds only on AMX or arm64 CPUs)", BIND_ENV, bound, len(bound))  # fmt: skip
    return result


def _sglang_binds_cpu_threads() -> bool:
    from sglang_specsot.host import adapter

    return adapter.sglang_binds_cpu_threads()
