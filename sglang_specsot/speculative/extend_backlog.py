"""Deferred draft-extend: the draft model catches up on plain steps only when it drafts again.

With a draft model, every step ends with a draft-extend over the accepted tokens, so that the
draft's KV follows the text. On a step where the budget policy drafts nothing (a plain
decode) that forward buys nothing yet; on this CPU a 0.5B draft-extend costs ~0.4x the 1.5B
target's forward, so a "plain" step would cost ~1.4x plain decoding. Instead, the tokens of
such steps are left as a backlog per request, and one draft-extend over the backlog runs
when the draft model is next needed, or, while drafting is near paying, before the backlog
would make that catch-up cost more than a plain step on top of the extend it replaces. A
forward costs overhead plus at most linear in its rows, so one catch-up is never more work
than the per-step extends it replaces.

Plain Python (no torch, no SGLang): the worker runs the forwards, this module keeps count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def catch_up_windows(ends: Sequence[int], behind: Sequence[int]) -> list[tuple[int, list[int]]]:
    """The draft-extend windows that bring every request's draft KV up to its end.

    SGLang's draft-extend gives every request the same window width `w`; a window
    (w, window_ends) covers positions [end - w, end) of each request. Request i holds
    `ends[i]` committed positions of which its last `behind[i]` are not in the draft's KV.
    A window may not start before position 0, so a short request (fewer tokens than the
    widest backlog) makes the catch-up take several windows, oldest tokens first; the
    last window ends at `ends` for every request, and its top-k is the next draft's.
    """
    assert ends and min(ends) >= 1, f"every request has a committed token, got ends {list(ends)}"
    assert all(0 <= b <= e for b, e in zip(behind, ends)), f"backlog {list(behind)} beyond ends {list(ends)}"
    behind = list(behind)
    windows = []
    while max(behind) > 0:
        w = min(max(behind), min(ends))
        window_ends = [min(e, e - b + w) for e, b in zip(ends, behind)]
        windows.append((w, window_ends))
        behind = [e - we for e, we in zip(ends, window_ends)]
    return windows


class ExtendBacklog:
    """Per request, the committed tokens the draft model's KV does not hold yet."""

    def __init__(self, max_behind: int = 256, max_rows: int = 512):
        assert max_behind >= 1 and max_rows >= 1, f"max_behind {max_behind}, max_rows {max_rows} must be >= 1"
        self.max_behind = max_behind  # a memory-and-latency cap per request
        # A cap on a catch-up's rows (requests x widest backlog): its forward computes
        # logits for every row, 300 MB at 512 rows of a 150k vocabulary in float32.
        self.max_rows = max_rows
        self._behind: dict[str, int] = {}
        self.deferred_steps = 0  # steps whose draft-extend was deferred
        self.catch_ups = 0  # catch-up forwards run (a window each)

    def lag(self, rids: Sequence[str]) -> list[int]:
        return [self._behind.get(rid, 0) for rid in rids]

    def catch_up_rows(self, rids: Sequence[str], more: int = 0) -> int:
        """The rows of a catch-up for these requests (each gets the widest backlog's window),
        after `more` further tokens each."""
        return len(rids) * (max(self.lag(rids), default=0) + more)

    def current(self, rids: Sequence[str]) -> bool:
        """Whether the draft's KV holds every committed token of these requests."""
        return not any(self.lag(rids))

    def add(self, rids: Sequence[str], accept_lens: Sequence[int]) -> None:
        for rid, k in zip(rids, accept_lens):
            self._behind[rid] = self._behind.get(rid, 0) + k

    def clear(self, rids: Sequence[str]) -> None:
        for rid in rids:
            self._behind.pop(rid, None)

    def keep(self, rids: Sequence[str]) -> None:
        """Drop the requests that left the batch (finished, aborted or retracted: a
        retracted one comes back through prefill, which extends the draft anew)."""
        live = set(rids)
        for rid in [r for r in self._behind if r not in live]:
            del self._behind[rid]

    def may_defer(self, rids: Sequence[str], catch_up_ms: Callable[[int], float], limit_ms: float) -> bool:
        """Whether this step's draft-extend may wait: the catch-up after one more plain step
        (`catch_up_ms(rows)`, rows = requests x widest backlog) would still cost at most
        `limit_ms` (the worker passes a one-token extend plus a plain step: the step that
        drafts again then costs at most one plain step more than a drafting step does; or no
        limit while no drafting is near paying), within `max_behind` and `max_rows`."""
        widest = max(self.lag(rids), default=0) + 1
        rows = self.catch_up_rows(rids, more=1)
        return widest <= self.max_behind and rows <= self.max_rows and catch_up_ms(rows) <= limit_ms

    def info(self) -> dict:
        return {
            "deferred_steps": self.deferred_steps,
            "catch_up_forwards": self.catch_ups,
            "requests_behind": sum(1 for b in self._behind.values() if b > 0),
        }
