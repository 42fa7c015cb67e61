"""The device check's `syncs` record (scripts/gpu_stages.py): the parity stage's SPECSOT
engines (context drafting and the target as its own draft, with and without graphs) counted
per step by `torch.cuda.set_sync_debug_mode` (scripts/gpu_sync_count.py); no engine of its
own, so no time of its own. Without engines (the CPU smoke), the counter on a stand-in worker."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import gpu_sync_count
from gpu_record import Recorder


def sync_log_env(tmp: Path, name: str) -> tuple[Path, dict]:
    """(the log, the environment) that has an engine's steps counted into a log of its own."""
    log = tmp / f"syncs-{name.replace(' ', '_')}.jsonl"
    return log, gpu_sync_count.engine_env(log)


def record_syncs(out: Path, logs: dict[str, Path]) -> None:
    """The `syncs` record: each engine's steps and its verdict, then one status."""
    rec = Recorder(out, "syncs")
    problems = {name: p for name, log in logs.items() if (p := gpu_sync_count.report(rec, name, log))}
    rec.finish("ok" if not problems else "failed", "; ".join(f"{n}: {p}" for n, p in problems.items()) or None,
               limit_per_step=gpu_sync_count.LIMIT_PER_STEP, engines=list(logs))  # fmt: skip


def record_syncs_smoke(out: Path) -> None:
    """Without engines (the CPU smoke): the counter on a stand-in worker, a prefill and two decode
    steps whose code raises torch's sync warning once, through the same log and record."""
    import warnings
    from types import SimpleNamespace

    class SpecSoTWorker:
        drafter = None

        def forward_batch_generation(self, batch):
            if batch.forward_mode.is_decode():
                warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
            return time.sleep(0)

    with tempfile.TemporaryDirectory(prefix="specsot-syncs-") as tmp:
        log = Path(tmp) / "syncs.jsonl"
        module = SimpleNamespace(SpecSoTWorker=SpecSoTWorker)
        gpu_sync_count.install(module, str(log))
        for decode in (False, True, True):
            mode = SimpleNamespace(is_decode=lambda decode=decode: decode)
            module.SpecSoTWorker().forward_batch_generation(SimpleNamespace(forward_mode=mode, reqs=[1]))
        record_syncs(out, {"stand-in worker": log})
