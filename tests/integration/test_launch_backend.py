"""A speculative CPU server launched with an attention backend that cannot verify (SmolLM2-135M).

Proves: it exits non-zero before "fired up", naming the flag to add, rather than report "fired
up" and let the scheduler die on the first verify (torch_native_backend.py:101). A launch
without any backend flag, which the plugin serves with specsot_cpu, is the CPU user's parity
server in test_specsot_server.py (`overlap-qlen_layout-no_backend_flag`): it checks the log line
saying so and its greedy parity there, instead of a server of its own here.
"""

from __future__ import annotations

import pytest

from sglang_specsot.launch import ServerProcess
from tests.integration.conftest import FIX, RULES_ROUTER_ENV, cpu_args, without_backend

pytestmark = pytest.mark.integration

NO_BACKEND = without_backend(cpu_args(max_total_tokens=8192))


@pytest.mark.parametrize(
    ("algorithm", "backend"),
    [("SPECSOT", "torch_native")] + [pytest.param("NGRAM", b, marks=pytest.mark.long) for b in ("torch_native", "intel_amx")],
)
def test_a_backend_that_cannot_verify_stops_the_launch(smollm2_path, tmp_path, algorithm, backend):
    args = NO_BACKEND + ["--speculative-algorithm", algorithm, "--attention-backend", backend]
    server = ServerProcess(smollm2_path, args, env=RULES_ROUTER_ENV, log_path=tmp_path / "server.log", startup_timeout=300)
    with pytest.raises(RuntimeError, match="exited with code"):
        server.start()
    log = server.log_path.read_text()
    assert server.proc.returncode != 0
    assert "fired up" not in log
    assert f"--speculative-algorithm {algorithm} on CPU needs an attention backend" in log
    assert f"--attention-backend {backend} cannot" in log and f"Use {FIX}" in log
