"""How a device-check stage reports (scripts/gpu_stages.py): one JSON line per result in the
run's file, a human line beside it, and the exception that blocked a stage, kept short."""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path


class Recorder:
    """Appends one JSON line per result to the run's file and prints a human line beside it."""

    def __init__(self, out: Path, stage: str) -> None:
        self.out, self.stage, self.started = out, stage, time.monotonic()

    def emit(self, line: str, **record) -> None:
        with open(self.out, "a", encoding="utf-8") as f:
            f.write(json.dumps({"stage": self.stage, **record}) + "\n")
        print(f"[{self.stage}] {line}", flush=True)

    def finish(self, status: str, blocker: str | None = None, detail: str = "", **record) -> None:
        seconds = round(time.monotonic() - self.started, 1)
        said = f": {blocker}" if blocker else (f": {detail}" if detail else "")
        self.emit(f"{status} in {seconds} s{said}", status=status, blocker=blocker, seconds=seconds, **record)


def blocker(exc: BaseException) -> str:
    """The exception and the innermost frames, as short as still tells where."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames))
    return f"{type(exc).__name__}: {exc} (at {where})"[:1500]
