"""One JSON line per finished cell; the file is the run's only state, so a run resumes."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

OK, FAILED = "ok", "failed"
CELLS_FILE, RUN_FILE = "cells.jsonl", "run.json"


@dataclass(frozen=True, slots=True)
class Branch:
    index: int
    start: float  # seconds from the request's start
    end: float
    tokens: int
    finish_reason: str
    ended: str = ""  # the trace's why: "stop", "aim", "budget", "loop" or "abort" ("": not recorded)


@dataclass(frozen=True, slots=True)
class CellResult:
    """What one configuration did with one question (status FAILED: `reason` says why)."""

    question_id: int
    config: str
    status: str
    suitable: bool
    reason: str = ""
    latency: float = 0.0  # seconds until the complete answer, measured by the client
    answer: str = ""
    output_tokens: int = 0  # every generated token (skeleton, branches, normal answer)
    path: str = "normal"  # "sot" or "normal" (the router or a fallback may choose normal)
    finish_reason: str = ""  # "length": a branch or the normal answer hit its token cap
    looped: bool = False  # the answer ends repeating itself (sot.loops.find_loop)
    accept_length: float | None = None  # per request (normal cells); None where not reported
    skeleton_seconds: float | None = None
    skeleton_text: str = ""
    points: int = 0
    fallback: bool = False  # SoT was tried but the skeleton was no plan
    skeleton_constrained: bool | None = None  # a logit processor kept it to numbered points
    empty_points: int | None = None  # points whose branch gave only the title (None: not recorded)
    branches: tuple[Branch, ...] = field(default=())
    # Mode "auto": the latency model's decision and predicted times (metadata.specsot.route.latency)
    route_latency: dict | None = None
    load: float | None = None  # the machine's 1-minute load average when the answer arrived
    commit: str = ""  # the git commit of the code that measured it
    # The server's rid of a normal answer; of a SoT answer, "specsot-<group>", which starts the
    # rid of each of its generations (serving/backend.py): how a SGLANG_SPECSOT_TRACE line is
    # matched to its question ("" in runs recorded before the field).
    rid: str = ""
    # Prompt and generated tokens by part, for replaying the answer's shape on other weights:
    # normal {"prompt", "completion"}; SoT {"skeleton_prompt", "skeleton", "branch_prompts",
    # "branch_cached"} (per point, in skeleton order); None where not recorded.
    token_parts: dict | None = None

    @property
    def key(self) -> tuple[int, str]:
        return (self.question_id, self.config)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.latency if self.latency > 0 else 0.0

    @property
    def hit_cap(self) -> bool:
        return self.finish_reason == "length"

    @property
    def longest_branch(self) -> float | None:
        return max((b.end - b.start for b in self.branches), default=None)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, row: dict) -> CellResult:
        names = {f.name for f in dataclasses.fields(cls)}
        row = {k: v for k, v in row.items() if k in names}
        row["branches"] = tuple(Branch(**b) for b in row.get("branches", ()))
        return cls(**row)


def append(path: Path, cell: CellResult) -> None:
    """Append one line and flush it, so a killed run loses at most the cell in flight."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(cell.to_json()) + "\n")
        f.flush()


def load(path: Path) -> dict[tuple[int, str], CellResult]:
    """The latest record of every cell; a torn last line (a killed run) is ignored."""
    cells: dict[tuple[int, str], CellResult] = {}
    if not path.exists():
        return cells
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            cell = CellResult.from_json(json.loads(line))
        except (ValueError, TypeError):
            continue
        if cell.status == OK or cells.get(cell.key, cell).status != OK:
            cells[cell.key] = cell  # a later failure never hides an earlier success
    return cells


def done_keys(cells: dict[tuple[int, str], CellResult]) -> set[tuple[int, str]]:
    """Cells that need no re-run; failed ones are retried."""
    return {key for key, cell in cells.items() if cell.status == OK}


def check_run_settings(out: Path, settings: dict) -> None:
    """Write run.json the first time; refuse to mix cells measured under other settings."""
    path = out / RUN_FILE
    if path.exists():
        old = json.loads(path.read_text())
        changed = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
        if changed:
            raise ValueError(
                f"{out} holds a run with other settings {changed} (old, new); "
                "use another --out or the same settings to resume"
            )
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2) + "\n")
