"""PNG plots: speed-up per configuration with quality beside it; per-question timelines."""

from __future__ import annotations

from pathlib import Path

from sglang_specsot.bench.configs import BASELINE
from sglang_specsot.bench.report import Row
from sglang_specsot.bench.store import OK, CellResult

TIMELINE_CONFIGS = ("SoT-server", "SpecSoT-server", "SoT-frontend", "SpecSoT-frontend")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def speedup_plot(rows: list[Row], path: Path, subset: str = "suitable") -> Path | None:
    """Bars: speed-up vs plain (left axis) and coverage of the normal answer (right axis)."""
    rows = [r for r in rows if r.subset == subset and r.speedup is not None]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r.speedup for r in rows], 0.4, label="speed-up vs plain (x)", color="tab:blue")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_ylabel("complete-answer speed-up (geo-mean)")
    ax.set_xticks(list(xs), [r.config for r in rows], rotation=30, ha="right")
    twin = ax.twinx()
    cover = [r.normal_covered if r.normal_covered is not None else 0.0 for r in rows]
    twin.bar([x + 0.2 for x in xs], cover, 0.4, label="normal answer covered (share)", color="tab:orange")
    twin.set_ylim(0, 1.05)
    twin.set_ylabel("share of normal answer's sentences covered")
    fig.legend(loc="lower center", ncol=2, fontsize=8)
    ax.set_title(f"Complete answer vs plain decoding, {subset} questions")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def timeline_plot(cells: dict[tuple[int, str], CellResult], qid: int, path: Path) -> Path | None:
    """One row per bar: each SoT configuration's skeleton and branches, and plain decoding's
    normal answer for scale; x is seconds from the request."""
    bars: list[tuple[str, float, float, str]] = []  # label, start, end, colour
    for name in TIMELINE_CONFIGS:
        cell = cells.get((qid, name))
        if cell is None or cell.status != OK or cell.path != "sot":
            continue
        bars.append((f"{name} skeleton", 0.0, cell.skeleton_seconds or 0.0, "tab:purple"))
        bars += [(f"{name} branch {b.index + 1}", b.start, b.end, "tab:green") for b in cell.branches]
        bars.append((f"{name} complete", 0.0, cell.latency, "tab:cyan"))
    base = cells.get((qid, BASELINE))
    if not bars or base is None or base.status != OK:
        return None
    bars.append(("plain (normal answer)", 0.0, base.latency, "tab:gray"))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(bars) + 1.2))
    for y, (label, start, end, colour) in enumerate(reversed(bars)):
        ax.barh(y, max(end - start, 0.01), left=start, color=colour)
    ax.set_yticks(range(len(bars)), [b[0] for b in reversed(bars)], fontsize=7)
    ax.set_xlabel("seconds")
    ax.set_title(f"question {qid}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
