"""The work directory of `train-eagle3`: JSON-lines rows appended as they finish, and tensor
files written whole (to a temporary name, then renamed), so a stage killed at any moment
leaves only finished work and a rerun picks up after it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


def read_rows(path: Path) -> list[dict]:
    """Every complete row; a last line cut off by a kill is ignored (its work is redone)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def append_row(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def save_atomic(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)
