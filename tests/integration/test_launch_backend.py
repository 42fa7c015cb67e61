"""A speculative CPU server launched without `--attention-backend specsot_cpu` (SmolLM2-135M).

Proves: with no attention backend it serves speculative verifies (SPECSOT drafting its whole
window every step, SGLANG_SPECSOT_FIXED_WINDOW=1), greedy output identical to
plain decoding, having said it chose specsot_cpu; with one that cannot verify it exits non-zero
before "fired up", naming the flag to add, rather than report "fired up" and let the
scheduler die on the first verify (torch_native_backend.py:101).
"""

from __future__ import annotations

import pytest

from sglang_specsot.launch import ServerProcess
from tests.integration.conftest import FIXED_WINDOW_ENV, SMOLLM2_PARITY_TOKENS, SPECSOT, cpu_args
from tests.integration.parity import BATCH_SIZES, mismatches, run_batches

pytestmark = pytest.mark.integration

MAX_NEW = 32
assert MAX_NEW <= SMOLLM2_PARITY_TOKENS  # compared with a prefix of the session's plain run
NUM_PROMPTS = sum(BATCH_SIZES[:4])  # the plain run's first batches, of 1..4: single and batched verifies
FIX = "--attention-backend specsot_cpu"


def _without_backend(args: list[str]) -> list[str]:
    i = args.index("--attention-backend")
    return args[:i] + args[i + 2 :]


NO_BACKEND = _without_backend(cpu_args(max_total_tokens=8192))


@pytest.fixture(scope="module")
def prompts(smollm2_parity) -> list[str]:
    return smollm2_parity[0][:NUM_PROMPTS]


@pytest.fixture(scope="module")
def plain_ids(smollm2_parity) -> list[list[int]]:
    # Plain decoding with NO_BACKEND's arguments and specsot_cpu, the same first batches.
    return [ids[:MAX_NEW] for ids in smollm2_parity[1][:NUM_PROMPTS]]


def test_no_backend_chosen_serves_verifies_with_specsot_cpu(smollm2_path, prompts, plain_ids, tmp_path):
    server = ServerProcess(smollm2_path, NO_BACKEND + SPECSOT, env=FIXED_WINDOW_ENV, log_path=tmp_path / "server.log")
    with server:
        results = run_batches(server, prompts, MAX_NEW)
        accept = server.get("/server_info")["internal_states"][0]["avg_spec_accept_length"]
        log = server.log_path.read_text()
    assert not mismatches(results, plain_ids), "SPECSOT with the chosen backend differs from plain decoding"
    assert accept > 1.0, f"no draft was accepted (avg accept length {accept}): did verify run?"
    assert f"no attention backend chosen, using {FIX}" in log


@pytest.mark.parametrize(
    ("algorithm", "backend"),
    [("SPECSOT", "torch_native")] + [pytest.param("NGRAM", b, marks=pytest.mark.long) for b in ("torch_native", "intel_amx")],
)
def test_a_backend_that_cannot_verify_stops_the_launch(smollm2_path, tmp_path, algorithm, backend):
    args = NO_BACKEND + ["--speculative-algorithm", algorithm, "--attention-backend", backend]
    server = ServerProcess(smollm2_path, args, log_path=tmp_path / "server.log", startup_timeout=300)
    with pytest.raises(RuntimeError, match="exited with code"):
        server.start()
    log = server.log_path.read_text()
    assert server.proc.returncode != 0
    assert "fired up" not in log
    assert f"--speculative-algorithm {algorithm} on CPU needs an attention backend" in log
    assert f"--attention-backend {backend} cannot" in log and f"Use {FIX}" in log
