"""Deferred draft-extend: the draft model catches up only when it drafts again.

With a draft model, SGLang extends the draft over every prompt (prefill) and over every
step's accepted tokens, so that the draft's KV follows the text. Where the budget policy
drafts nothing (a plain decode) those forwards buy nothing yet, and on a CPU a draft forward
costs a sizeable share of a target forward, so a "plain" step would cost well over plain
decoding and every prompt more than its prefill. Instead, the tokens of such prompts and
steps are left as a backlog per request, and one catch-up (a prefill-shaped draft-extend
over every request's backlog) runs when the draft model is next needed, or, while drafting
is near paying, before the backlog would make that catch-up cost more than a plain step on
top of the extend it replaces. A forward costs overhead plus at most linear in its rows, so
one catch-up is never more work than the extends it replaces.

A drafting step's own tokens go through the same ledger: the tokens its chain fed have their
draft KV (a draft forward writes it), so only the rest are behind, usually the bonus token
alone, and the step's extend is a catch-up of those (`step_extends`, `reused_rows`).

Plain Python (no torch, no SGLang): the worker runs the forwards, this module keeps count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def catch_up_passes(ends: Sequence[int], behind: Sequence[int], max_rows: int) -> list[list[tuple[int, int]]]:
    """The draft-extend forwards that bring every request's draft KV up to its end.

    Request i holds `ends[i]` committed positions of which the last `behind[i]` are not in
    the draft's KV. A pass extends each request over positions [start, end) (a prefill-shaped
    forward: ragged, logits at each request's last row only); every request takes part in
    every pass with at least one row, since the pass returns the top-k of every request's
    last row. A request with nothing (or nothing more) behind re-extends its last committed
    position, which rewrites that KV unchanged. The passes cover the backlogs oldest first, at
    most about `max_rows` rows each; the last pass ends at `ends` for every request, so its
    top-k is the next draft's. No passes when nothing is behind.
    """
    assert ends and min(ends) >= 1, f"every request has a committed token, got ends {list(ends)}"
    assert all(0 <= b <= e for b, e in zip(behind, ends)), f"backlog {list(behind)} beyond ends {list(ends)}"
    assert max_rows >= 1, f"max_rows {max_rows} must be >= 1"
    quota = max(1, max_rows // len(ends))
    left = list(behind)
    passes = []
    while any(left):
        ranges = []
        for i, e in enumerate(ends):
            if left[i] == 0:
                ranges.append((e - 1, e))
                continue
            start = e - left[i]
            n = min(left[i], quota)
            ranges.append((start, start + n))
            left[i] -= n
        passes.append(ranges)
    return passes


def passes_ms(rows: int, pass_rows: int, ms: Callable[[int], float]) -> float:
    """What `rows` rows of catch-up cost in passes of at most `pass_rows` rows, a pass of r
    rows costing `ms(r)` (the last pass takes what is left)."""
    assert pass_rows >= 1, f"pass_rows {pass_rows} must be >= 1"
    full, rest = divmod(rows, pass_rows)
    return full * ms(pass_rows) + (ms(rest) if rest else 0.0)


def deduplicated(ends: Sequence[int], behind: Sequence[int], shared: Sequence[int], max_rows: int) -> list[int]:
    """Each request's backlog less its `shared` leading positions, which an earlier request
    of the same catch-up extends (draft_kv.shared_backlog), where that catch-up is one pass:
    the pass writes every row's KV before any row attends, so a request may attend to slots
    another request writes in it; across passes that order would not hold. `behind`
    unchanged otherwise."""
    assert all(0 <= s < max(b, 1) for s, b in zip(shared, behind)), f"shared {list(shared)} not within {list(behind)}"
    lags = [b - s for b, s in zip(behind, shared)]
    return lags if len(catch_up_passes(ends, lags, max_rows)) <= 1 else list(behind)


# A catch-up's price is corrected by what catch-ups have really cost (ExtendBacklog.price_ratio):
# this much agreement (ms real and priced alike) before the first one is seen, so that one
# interrupted pass does not swing it, and never by more than these factors.
PRICE_PRIOR_MS = 1000.0
PRICE_RATIO_BOUNDS = (0.5, 3.0)


class ExtendBacklog:
    """Per request, the committed tokens the draft model's KV does not hold yet."""

    def __init__(self, max_rows: int = 4096):
        # A catch-up pass's rows, as SGLang bounds a prefill forward (--chunked-prefill-size).
        assert max_rows >= 1, f"max_rows {max_rows} must be >= 1"
        self.max_rows = max_rows
        self._behind: dict[str, int] = {}
        self.deferred_steps = 0  # steps whose draft-extend was deferred
        self.deferred_prefills = 0  # prefills (a chunked prompt: each chunk) the draft did not extend
        self.catch_ups = 0  # catch-up forwards run (a pass each)
        self.shared_rows = 0  # backlog rows a catch-up left to another request (deduplicated)
        self.step_extends = 0  # draft-extends of a drafting step's own tokens (not catch-ups)
        self.reused_rows = 0  # committed tokens whose draft KV the draft's chain had written
        # Catch-ups (not a drafting step's own extend): their rows, their time, and what the
        # cost model priced them at before they ran (`_setup_ms`), all summed.
        self.catch_up_rows_total = 0
        self.catch_up_ms_total = 0.0
        self.catch_up_priced_ms = 0.0

    def lag(self, rids: Sequence[str]) -> list[int]:
        return [self._behind.get(rid, 0) for rid in rids]

    def catch_up_rows(self, rids: Sequence[str], more: int = 0, shared: Sequence[int] | None = None) -> int:
        """The rows of a catch-up for these requests (at least one each, see
        catch_up_passes), after `more` further tokens each, less the `shared` positions an
        earlier request extends for them (`deduplicated`); 0 when all are current."""
        lags = [b + more for b in self.lag(rids)]
        if shared is not None:
            lags = [b - s for b, s in zip(lags, shared)]
        return sum(max(1, b) for b in lags) if any(lags) else 0

    def count_catch_up(self, rows: int, ms: float, priced_ms: float) -> None:
        """One catch-up pass of `rows` rows that took `ms` where the cost model priced it at
        `priced_ms`."""
        self.catch_ups += 1
        self.catch_up_rows_total += rows
        self.catch_up_ms_total += ms
        self.catch_up_priced_ms += priced_ms

    def price_ratio(self) -> float:
        """What catch-ups have really cost against what the cost model priced them at (its
        forward probes and overhead: a catch-up also pays attention over its rows times the
        context, which grows with both), as a factor for the next catch-up's price. Starts at
        1 and moves as catch-up time accrues (`PRICE_PRIOR_MS` of agreement first), within
        `PRICE_RATIO_BOUNDS`. Catch-ups cost more than priced (docs/benchmarks.md), so an
        uncorrected price would start drafting runs that do not repay their catch-up."""
        ratio = (self.catch_up_ms_total + PRICE_PRIOR_MS) / (self.catch_up_priced_ms + PRICE_PRIOR_MS)
        low, high = PRICE_RATIO_BOUNDS
        return min(high, max(low, ratio))

    def current(self, rids: Sequence[str]) -> bool:
        """Whether the draft's KV holds every committed token of these requests."""
        return not any(self.lag(rids))

    def add(self, rids: Sequence[str], accept_lens: Sequence[int]) -> None:
        for rid, k in zip(rids, accept_lens):
            self._behind[rid] = self._behind.get(rid, 0) + k

    def start(self, rid: str, behind: int) -> None:
        """A request prefilled without the draft: `behind` of its positions lack draft KV (its
        prompt's new tokens, and any of its cached prefix the draft never extended)."""
        self.deferred_prefills += 1
        if behind:
            self._behind[rid] = behind
        else:
            self._behind.pop(rid, None)

    def clear(self, rids: Sequence[str]) -> None:
        for rid in rids:
            self._behind.pop(rid, None)

    def keep(self, rids: Sequence[str]) -> None:
        """Drop the requests that left the batch (finished, aborted or retracted: what they
        left undone is recorded per KV slot, see DraftKVSlots)."""
        live = set(rids)
        for rid in [r for r in self._behind if r not in live]:
            del self._behind[rid]

    def may_defer(
        self, rids: Sequence[str], catch_up_ms: Callable[[int], float], limit_ms: float,
        shared: Sequence[int] | None = None,
    ) -> bool:  # fmt: skip
        """Whether this step's draft-extend may wait: the catch-up after one more plain step
        (`catch_up_ms(rows)`) would still cost at most `limit_ms` (the worker passes a
        one-token extend plus a plain step: the step that drafts again then costs at most one
        plain step more than a drafting step does; or no limit while no drafting is near
        paying: a backlog costs no memory, and a drafting plan must repay its catch-up)."""
        return catch_up_ms(self.catch_up_rows(rids, more=1, shared=shared)) <= limit_ms

    def info(self) -> dict:
        return {
            "deferred_steps": self.deferred_steps,
            "deferred_prefills": self.deferred_prefills,
            "catch_up_forwards": self.catch_ups,
            "shared_rows": self.shared_rows,
            "step_extends": self.step_extends,
            "reused_rows": self.reused_rows,
            "catch_up_rows": self.catch_up_rows_total,
            "catch_up_ms": round(self.catch_up_ms_total, 1),
            "catch_up_priced_ms": round(self.catch_up_priced_ms, 1),
            "catch_up_price_ratio": round(self.price_ratio(), 3),
            "requests_behind": sum(1 for b in self._behind.values() if b > 0),
        }
