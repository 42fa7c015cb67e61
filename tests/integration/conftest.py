"""What the integration modules share: the CPU server arguments and a plain SmolLM2 server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sglang_specsot.launch import ServerProcess

# SGLang's context-only SPECSOT: no draft model, a 6-token verify window.
SPECSOT = ["--speculative-algorithm", "SPECSOT", "--speculative-num-draft-tokens", "6"]


def cpu_args(max_total_tokens: int = 4096, mem_fraction_static: float | None = 0.3) -> list[str]:
    """SGLang's flags for a CPU server, small on purpose: two cores serve every configuration.

    --sleep-on-idle makes the idle scheduler poll once a second (idle_sleeper.py: poll(1000))
    instead of spinning, so on_idle, and its memory check, runs about once a second.
    """
    args = ["--device", "cpu", "--attention-backend", "specsot_cpu", "--dtype", "float32",
            "--max-total-tokens", str(max_total_tokens), "--sleep-on-idle"]  # fmt: skip
    if mem_fraction_static is not None:
        args += ["--mem-fraction-static", str(mem_fraction_static)]
    return args


@pytest.fixture(scope="module")
def smollm2_server(smollm2_path) -> Iterator[ServerProcess]:
    """A plain SmolLM2 server per module."""
    with ServerProcess(smollm2_path, cpu_args()) as server:
        yield server
