"""What a checkpoint's weights and this machine's free memory come to, for choices that must fit
in memory: the CPU dtype (cpu/dtype.py: float32 doubles the weights) and the end-to-end
benchmark's servers side by side (bench/e2e.py)."""

from __future__ import annotations

from pathlib import Path

import psutil

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def weight_file_bytes(path: str | Path) -> int:
    """The size of the weight files in the checkpoint directory `path` (0 where it is not a
    local directory, e.g. a hub id, or holds none)."""
    path = Path(path)
    if not path.is_dir():
        return 0
    return sum(f.stat().st_size for f in path.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file())


def available_bytes() -> int | None:
    """Memory available to new processes (psutil, which SGLang already needs: MemAvailable on
    Linux), None where it cannot be read."""
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError):
        return None
