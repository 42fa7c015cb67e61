from __future__ import annotations

from sglang_specsot.bench.store import FAILED, OK, Branch, CellResult


def cell(qid: int, config: str, latency: float = 1.0, answer: str = "An answer here.", status: str = OK,
         suitable: bool = True, **kw) -> CellResult:  # fmt: skip
    return CellResult(qid, config, status, suitable, latency=latency, answer=answer, **kw)


def sot_cell(qid: int, config: str, latency: float, **kw) -> CellResult:
    kw.setdefault("branches", (Branch(0, 1.0, 2.0, 10, "stop"), Branch(1, 1.0, 3.5, 20, "length")))
    return cell(qid, config, latency, path="sot", skeleton_seconds=0.9, points=2,
                output_tokens=40, finish_reason="length", **kw)  # fmt: skip


__all__ = ["FAILED", "OK", "cell", "sot_cell"]
