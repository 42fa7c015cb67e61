"""The training progress bar: updates done, tokens per second, loss and the first step's
accuracy, on stderr (stdout carries only the head's directory)."""

from __future__ import annotations

import sys
import time


class Bar:
    def __init__(self) -> None:
        self._bar = None
        self._tokens = 0
        self._began = 0.0  # the first update's start: the earlier stages do not count

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()

    def update(self, done: int, total: int, row: dict) -> None:
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(total=total, initial=done - 1, desc="train-eagle3", unit="update", file=sys.stderr)
            self._began = time.monotonic() - row["seconds"]
        self._tokens += row["tokens"]
        rate = self._tokens / max(1e-9, time.monotonic() - self._began)
        acc = row["acc"][0]
        self._bar.set_postfix_str(f"{rate:.0f} tok/s loss {row['loss']:.3f} acc0 {acc if acc is not None else '-'}")
        self._bar.update(1)
