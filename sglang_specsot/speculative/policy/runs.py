"""Ledgers of what drafting earned: runs of drafting steps by batch, and the fund exploring spends.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence


class DraftingRuns:
    """How many steps a batch goes on drafting once its plan starts drafting, and what such a
    run saved against plain decoding, by the batch it began at (the worker's `runs_key`: its
    size and the SoT roles in it).

    A drafting plan after plain steps must repay its setup (a deferred draft-extend's
    catch-up) in the steps it drafts before the policy turns plain again. The steps the batch
    has left overstate that horizon where drafting runs only a few steps at a time, so the
    horizon is also capped by the runs measured at this batch (their mean over the last
    `window` completed runs, once `min_runs` have been seen).

    The plan's expected savings are a model's; what a run really saved is measured here: each
    drafting step's committed tokens at plain decoding's time per token, less the step's time
    (its catch-up included), less what the plain steps since the last run spent extending
    the draft ahead of it (flushes). Where the last runs at a batch saved nothing on average,
    no run there should start behind a setup (`pays`): the plans' model can predict a gain
    that the runs do not deliver.

    A batch's size alone does not say what its runs save: a SoT skeleton at batch 1 is a short
    plan behind a long prompt to catch up, a normal answer at batch 1 a long text where the
    draft's chains pay. Keyed by size alone, on a server answering both, skeletons' short
    losing runs would set the batch-1 verdict and cut the normal answers' horizon, and normal
    answers' gains could send skeletons into catch-ups; so the key is the batch's size and roles.

    Runs begun by an exploring step are not counted: exploring drafts to learn, and its run
    says nothing of how long, or whether, drafting pays. A key whose last run ended more than
    `fresh_steps` steps ago is forgotten, so a verdict is measured again when the text or the
    load has changed (at most `min_runs` runs every `fresh_steps` steps).

    Measuring again costs what the verdict saves: `min_runs` runs, each behind a catch-up. A
    losing verdict measured again and found losing again therefore lasts twice as long each
    time, up to `2 ** max_backoff` x `fresh_steps` (a paying one, or one that pays again, keeps
    `fresh_steps`): re-measured at a fixed period, a losing verdict would cost its runs for as
    long as the server lives (`totals` shows what each verdict cost). A first verdict keeps
    `fresh_steps`: it may come from a server's first, unrepresentative runs (short runs behind
    catch-ups at a cold acceptance).
    """

    def __init__(
        self, window: int = 8, min_runs: int = 3, max_keys: int = 64, fresh_steps: int = 500, max_backoff: int = 4
    ):
        assert window >= 1 and 1 <= min_runs <= window, f"window {window}, min_runs {min_runs}"
        assert max_backoff >= 0, f"max_backoff {max_backoff}"
        self.window, self.min_runs, self.max_keys, self.fresh_steps = window, min_runs, max_keys, fresh_steps
        self.max_backoff = max_backoff
        # key -> last completed runs, (steps, ms saved against plain decoding)
        self._runs: OrderedDict[Hashable, deque[tuple[int, float]]] = OrderedDict()
        self._last: dict[Hashable, int] = {}  # key -> step its last run ended at
        self._lost: dict[Hashable, int] = {}  # key -> losing verdicts in a row, each measured afresh
        # key -> every run's count and ms saved in the server's life: [plan's, exploring's]
        self._totals: OrderedDict[Hashable, list[list[float]]] = OrderedDict()
        self._steps = 0
        self._length = 0  # steps of the run under way
        self._saved = 0.0  # ms it saved so far
        self._owed = 0.0  # ms plain steps spent since the last run readying the next one
        self._key: Hashable = None  # the batch it began at
        self._counted = False  # whether it began on a plan (not exploring)

    def step(self, key: Hashable, drafted: bool, exploring: bool = False, saved_ms: float = 0.0) -> None:
        """One decode step of the batch `key` names, which drafted or not, and saved
        `saved_ms` against plain decoding (negative: it cost more; a plain step's extend)."""
        self._steps += 1
        if drafted:
            if self._length == 0:
                self._key, self._counted = key, not exploring
                self._saved, self._owed = -self._owed if self._counted else 0.0, 0.0
            self._length += 1
            self._saved += saved_ms
            return
        if self._length:
            self._count(self._key, self._counted, self._saved)
        if self._length and self._counted:
            # Only queries expire a verdict; a run begun without one (no setup to repay) must
            # not join a stale window, nor keep a losing verdict from counting as lost.
            self._fresh(self._key)
            self._runs.setdefault(self._key, deque(maxlen=self.window)).append((self._length, self._saved))
            self._runs.move_to_end(self._key)
            self._last[self._key] = self._steps
            while len(self._runs) > self.max_keys:
                oldest = self._runs.popitem(last=False)[0]
                del self._last[oldest]
                self._lost.pop(oldest, None)
        self._length = 0
        self._owed -= saved_ms

    def _count(self, key: Hashable, counted: bool, saved_ms: float) -> None:
        total = self._totals.setdefault(key, [[0, 0.0], [0, 0.0]])[0 if counted else 1]
        total[0] += 1
        total[1] += saved_ms
        self._totals.move_to_end(key)
        while len(self._totals) > self.max_keys:
            self._totals.popitem(last=False)

    def totals(self) -> dict[str, dict[str, float]]:
        """Every run so far by the key it began at (what each verdict cost to measure), the
        runs exploring began apart: for /server_info, where `info` shows fresh verdicts only."""
        return {
            str(key): {
                "runs": int(plan[0]), "saved_ms": round(plan[1], 1),
                "exploring_runs": int(explore[0]), "exploring_saved_ms": round(explore[1], 1),
            }
            for key, (plan, explore) in self._totals.items()
        }  # fmt: skip

    @property
    def exploring_run(self) -> bool:
        """Whether the last step drafted in a run begun by an exploring step."""
        return self._length > 0 and not self._counted

    def _fresh(self, key: Hashable) -> Sequence[tuple[int, float]]:
        """The last runs begun at `key`, or none where too few or too old."""
        runs = self._runs.get(key, ())
        if runs and self._steps - self._last[key] > self._lifetime(key, runs):
            if len(runs) >= self.min_runs:  # a verdict ends: count it if it lost
                lost = self._lost.pop(key, 0)
                if _pays(runs) is False:
                    self._lost[key] = lost + 1
                    while len(self._lost) > self.max_keys:
                        del self._lost[next(iter(self._lost))]
            del self._runs[key], self._last[key]
            return ()
        return runs if len(runs) >= self.min_runs else ()

    def _lifetime(self, key: Hashable, runs: Sequence[tuple[int, float]]) -> int:
        """Steps the verdict of `runs` lasts after their last one ended (see the class)."""
        if len(runs) < self.min_runs or _pays(runs) is not False:
            return self.fresh_steps
        return self.fresh_steps * 2 ** min(self._lost.get(key, 0), self.max_backoff)

    def expected(self, key: Hashable) -> float | None:
        """Mean length of the last runs begun at `key`; None while too few."""
        runs = self._fresh(key)
        return sum(n for n, _ in runs) / len(runs) if runs else None

    def pays(self, key: Hashable) -> bool | None:
        """Whether the last runs begun at `key` saved time on average, setup included; None
        while too few have been measured, or where nothing was (every saving exactly 0: a
        worker that does not time its steps)."""
        runs = self._fresh(key)
        return _pays(runs) if runs else None

    def info(self) -> dict[str, dict[str, float]]:
        out = {}
        for key in list(self._runs):
            runs = self._fresh(key)
            if runs:
                out[str(key)] = {
                    "steps": round(sum(n for n, _ in runs) / len(runs), 2),
                    "saved_ms": round(_saved(runs) / len(runs), 1),
                    # steps until measured again (longer for a verdict that keeps losing)
                    "fresh_for": self._lifetime(key, runs) - (self._steps - self._last[key]),
                }
        return out


def _saved(runs: Sequence[tuple[int, float]]) -> float:
    return sum(saved for _, saved in runs)


def _pays(runs: Sequence[tuple[int, float]]) -> bool | None:
    """Whether `runs` saved time together; None where nothing was measured (all 0)."""
    return _saved(runs) > 0.0 if any(saved for _, saved in runs) else None


class ExploreFund:
    """What exploring may still spend: a share of the time drafting has saved, measured.

    Exploring drafts where the plan would not, to learn whether drafting pays again; its
    schedule spends `explore_share` of plain steps' time on it. Where drafting never pays,
    that share is a tax on every answer (each exploring step first catches the draft up over
    the batch's backlog). So exploring is funded by what it may find: the balance earns
    `share` of every step's measured saving against plain decoding (a drafting step's; a
    flush's, negative), is charged the whole measured saving (mostly a cost) of every
    exploring step and of the drafting run it begins, and exploring waits while the balance
    is negative. It starts at 0, so a server explores once before it has earned anything (a
    cold server's first exploring step), and one whose drafting never pays then decodes as
    plain decoding does. Plain Python.
    """

    def __init__(self, share: float):
        assert 0.0 <= share < 1.0, f"share {share} outside [0, 1)"
        self.share = share
        self.balance_ms = 0.0
        self.unfunded = 0  # plain steps on which exploring waited for the balance

    def earn(self, saved_ms: float) -> None:
        """A step not begun by exploring saved `saved_ms` against plain decoding."""
        self.balance_ms += self.share * saved_ms

    def charge(self, saved_ms: float) -> None:
        """An exploring step, or a step of the run it began, saved `saved_ms` (negative: cost)."""
        self.balance_ms += saved_ms

    def allows(self) -> bool:
        return self.balance_ms >= 0.0

    def info(self) -> dict[str, float]:
        return {"balance_ms": round(self.balance_ms, 1), "unfunded": self.unfunded}
