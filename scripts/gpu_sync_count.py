"""Blocking host syncs per SPECSOT step, counted by torch itself on a GPU (issue 83, deliver 5).

In an engine's scheduler process (scripts/own_capture_site/sitecustomize.py installs it there
when SPECSOT_SYNC_LOG names a file), every `SpecSoTWorker.forward_batch_generation` runs under
`torch.cuda.set_sync_debug_mode("warn")`: each synchronizing CUDA operation (a device-to-host
copy: item, tolist, cpu, bool; a pageable host-to-device copy; torch.cuda.synchronize; nonzero)
raises torch's warning "called a synchronizing CUDA operation", caught here with the Python
stack that made it. One JSON line a step: decode or prefill, the drafter, and where each sync
came from: our package (`ours`, what the CPU counterpart counts: tests/unit/speculative/
sync_counter.py, test_sync_count.py), SGLang, or other. Decode steps may have at most
LIMIT_PER_STEP of ours, with context drafting and with a draft model alike.

Without CUDA (the CPU smoke) the steps are logged with `counted: false`. Every CONTROL_EVERY
steps a deliberate sync outside the step proves the counter sees torch's warnings.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

LOG_ENV = "SPECSOT_SYNC_LOG"
MESSAGE = "synchronizing CUDA operation"  # torch: c10/cuda/CUDAFunctions.h warn_or_error_on_sync
LIMIT_PER_STEP = 1
_SKIP = ("/warnings.py", "/torch/", __file__)  # frames that relay the warning, not that made it


def origin(frames: list[tuple[str, int, str]]) -> dict:
    """Where a sync came from, given the stack (outermost first) at the warning: the innermost
    frame outside torch and the warnings module, its kind (ours, sglang, other), and the
    innermost frame of our package (the step's code that led there)."""
    own = [f for f in frames if not any(s in f[0] for s in _SKIP)]
    if not own:
        return {"kind": "other", "at": "?", "ours_at": None}
    filename, lineno, name = own[-1]
    ours = [f for f in own if "/sglang_specsot/" in f[0]]
    kind = "ours" if ours and ours[-1] == own[-1] else "sglang" if "/sglang/" in filename else "other"
    return {"kind": kind, "at": _short(filename, lineno, name), "ours_at": _short(*ours[-1]) if ours else None}


def _short(filename: str, lineno: int, name: str) -> str:
    for root in ("/sglang_specsot/", "/sglang/"):
        if root in filename:
            filename = root.strip("/") + "/" + filename.rsplit(root, 1)[1]
            break
    return f"{filename}:{lineno} {name}"


class StepSyncs:
    """The sync warnings raised while a step is open, with where each came from."""

    def __init__(self) -> None:
        self.open: list[dict] | None = None
        self._lock = threading.Lock()

    def hook(self, original):
        """A `warnings.showwarning` that takes torch's sync warnings while a step is open."""

        def show(message, category, filename, lineno, file=None, line=None):
            if self.open is not None and MESSAGE in str(message):
                frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_stack()[:-1]]
                with self._lock:
                    self.open.append(origin(frames))
                return
            original(message, category, filename, lineno, file, line)

        show._specsot_syncs = True
        return show


CONTROL_EVERY = 8  # steps between control syncs (one read of a device scalar, outside the step)


def install(module, log: str | None = None) -> None:
    """Wrap `module.SpecSoTWorker.forward_batch_generation` (sglang_specsot.speculative.worker):
    each call counted, one JSON line appended to `log` (SPECSOT_SYNC_LOG) per call. Every
    CONTROL_EVERY steps, before the step, one deliberate sync is counted apart (`control`): a
    counter that misses it (a warnings filter or hook put in its way) fails the verdict rather
    than report no syncs."""
    import torch

    log = log or os.environ[LOG_ENV]
    counted = torch.cuda.is_available()
    steps, syncs = itertools.count(), StepSyncs()
    original = module.SpecSoTWorker.forward_batch_generation

    def window(run):
        """`run()` with its sync warnings gathered into `syncs.open`."""
        if not getattr(warnings.showwarning, "_specsot_syncs", False):  # not yet, or replaced since
            warnings.showwarning = syncs.hook(warnings.showwarning)
        warnings.filterwarnings("always", message=f".*{MESSAGE}")  # back to the front: every one
        syncs.open = []
        if counted:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            return run()
        finally:
            if counted:
                torch.cuda.set_sync_debug_mode("default")

    def forward_batch_generation(self, batch, *args, **kwargs):
        step, control = next(steps), None
        if counted and step % CONTROL_EVERY == 0:
            window(lambda: torch.ones(1, device="cuda").item())
            control = len(syncs.open)
        syncs.open = None
        decode = bool(batch.forward_mode.is_decode())
        started = time.perf_counter()
        try:
            return window(lambda: original(self, batch, *args, **kwargs))
        finally:
            found, syncs.open = syncs.open or [], None
            record = {"step": step, "decode": decode, "bs": len(getattr(batch, "reqs", ()) or ()),
                      "drafter": type(getattr(self, "drafter", None)).__name__, "counted": counted,
                      "control": control, "syncs": len(found), "ours": sum(s["kind"] == "ours" for s in found),
                      "where": found, "host_ms": round((time.perf_counter() - started) * 1e3, 3)}  # fmt: skip
            with open(log, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    module.SpecSoTWorker.forward_batch_generation = forward_batch_generation


def read_steps(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


def summary(steps: list[dict]) -> dict:
    """Decode steps' syncs, ours and all, step by step; the places they came from, by count."""
    decode = [s for s in steps if s["decode"]]
    places = Counter(f"{w['kind']} {w['at']}" + (f" (from {w['ours_at']})" if w["kind"] != "ours" and w["ours_at"] else "")
                     for s in decode for w in s["where"])  # fmt: skip
    return {"decode_steps": len(decode), "counted": all(s["counted"] for s in decode) if decode else None,
            "ours_by_step": [s["ours"] for s in decode], "all_by_step": [s["syncs"] for s in decode],
            "ours_max": max((s["ours"] for s in decode), default=None),
            "drafters": sorted({s["drafter"] for s in decode}), "places": dict(places.most_common(12))}  # fmt: skip


def verdict(steps: list[dict], limit: int = LIMIT_PER_STEP) -> str | None:
    """Why the steps fail the sync budget, or None. Uncounted steps (no CUDA) are no failure."""
    decode = [s for s in steps if s["decode"]]
    if not decode:
        return "no decode step was logged (the counter was not installed in the scheduler?)"
    missed = [s["step"] for s in steps if s["counted"] and s.get("control") == 0]
    if missed:
        return f"the counter missed its control sync before steps {missed}: a warnings filter or hook is in its way"
    over = [s["step"] for s in decode if s["counted"] and s["ours"] > limit]
    if over:
        worst = max(decode, key=lambda s: s["ours"])
        ours = [w["at"] for w in worst["where"] if w["kind"] == "ours"]
        return f"{len(over)} of {len(decode)} decode steps wait for the device more than {limit}x in our code; step {worst['step']}: {ours}"
    return None


def report(rec, engine: str, log: Path) -> str | None:
    """Each step as a JSON line through `rec` (a gpu_record.Recorder), then the engine's
    summary; returns the verdict."""
    steps = read_steps(log)
    for s in steps:
        rec.emit(f"{engine} step {s['step']} ({'decode' if s['decode'] else 'prefill'}, bs {s['bs']}): "
                 f"{s['syncs']} syncs, {s['ours']} ours" + ("" if s["counted"] else " (not counted: no CUDA)"),
                 engine=engine, kind="sync_step", **s)  # fmt: skip
    problem = verdict(steps)
    said = summary(steps)
    rec.emit(f"{engine}: ours by decode step {said['ours_by_step']}, all {said['all_by_step']}"
             + (f": {problem}" if problem else ""), engine=engine, kind="sync_summary", problem=problem, **said)  # fmt: skip
    return problem


def engine_env(log: Path) -> dict:
    """What an engine's processes need in their environment to be counted."""
    here = Path(__file__).resolve().parent
    path = [str(here / "own_capture_site"), str(here), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return {LOG_ENV: str(log), "PYTHONPATH": os.pathsep.join(dict.fromkeys(p for p in path if p))}
