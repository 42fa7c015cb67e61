"""An append-only JSON-lines file named by an environment variable: the step log's and the
acceptance trace's (`step_log.py`, `trace.py`). Plain Python.

The scheduler's process is its only writer, and it is line-buffered, so a server that dies
mid-run loses no step already written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


class JsonLinesFile:
    """Appends lines to one file; a subclass names its variable in `ENV`."""

    ENV: str = ""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "a", buffering=1)  # line-buffered: a crash loses no step

    @classmethod
    def from_env(cls):
        """The file the subclass's variable names, or None where it is unset or empty."""
        path = os.environ.get(cls.ENV)
        return cls(path) if path else None

    def write_lines(self, lines: Iterable[str]) -> None:
        self._file.write("".join(line + "\n" for line in lines))
