"""Per-step draft budgets that maximise expected accepted tokens per second.

Each step the worker asks `plan_step` how many draft tokens each request gets. The answer
weighs what drafts are expected to bring (each request's running acceptance, shared by the
branches of one SoT group, which write alike) against what the verify window costs on this
machine (`CostModel`, measured). When no budget beats plain decoding in tokens per ms, the
step is a plain decode: one row per request, no drafts.

The acceptance model is a truncated geometric chain: a drafted token is accepted with
probability `p` given its parent was, so `b` drafts bring `p + p^2 + ... + p^b` tokens on top
of the bonus token. `p` is estimated per group from what verify accepted, and on plain steps
from what it would have accepted (shadow.py): successes are accepted drafts, failures are
steps that stopped before the budget, decayed so that the estimate follows the text; it
starts from, and drifts back to while a group gets no drafts, the server's recent acceptance
over all groups.

Plain Python (no torch, no SGLang).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import json
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang_specsot.costs.cost_model import CostModel

# In a SPECSOT server's environment, "1": every step drafts the whole window whatever it costs,
# as SGLang's own fixed-step algorithms do (parity tests that must exercise verify; studies of
# what a fixed window does). Unset, SPECSOT sizes each step's drafts from its measured costs.
FIXED_WINDOW_ENV = "SGLANG_SPECSOT_FIXED_WINDOW"


@dataclass(frozen=True)
class AdaptiveConfig:
    """SGLang's `--speculative-adaptive-config` read for SPECSOT, plus SPECSOT's own keys.

    SGLang's format maps a batch size ("1", "8", ...; a batch uses the largest key not above
    its size) to `candidate_steps`; for SPECSOT a candidate is a per-request draft budget in
    tokens (0 = plain decode). SPECSOT's keys live under "specsot" (SGLang's loader skips
    non-numeric keys): `decay`, `prior_accepts`, `prior_misses`, `min_token_prob`,
    `defer_draft_extend`, `explore_share`, `explore_p`, `cold_verifies`, `long_match`,
    `runner_ups`.
    """

    buckets: tuple[tuple[int, tuple[int, ...]], ...]  # (smallest batch size, budgets), increasing
    decay: float = 0.1  # weight of one step's verifies in a group's (and a role's) acceptance estimate
    prior_accepts: float = 1.0  # pseudo-counts of the prior p = 0.5 ...
    prior_misses: float = 1.0  # ... that a group starts from and drifts back to
    min_token_prob: float = 0.05  # a request's budget stops where p^b falls below this
    # With a draft model: a plain step defers the draft-extend to when the draft is next
    # needed (extend_backlog.py); false runs it every step, as SGLang's workers do.
    defer_draft_extend: bool = True
    # With a draft model, share of the time of plain steps that may go to trying drafts
    # again: its estimates learn only from drafted steps, so a batch that stopped drafting
    # drafts one step (the smallest candidate budget) every `explore_every` plain steps.
    # 0 = never. (SoT-context drafts learn from shadow drafts, shadow.py, and never explore.)
    # Exploring is also funded by what drafting saved (`ExploreFund`): the same share of it.
    explore_share: float = 0.05
    # The acceptance exploring hopes to find: a batch explores only where, at this `p` for
    # every request, some budget would beat plain decoding by more than `explore_share` (what
    # exploring may cost). Where even that cannot pay (large batches on a CPU), exploring is
    # pure cost. 0.8 is what a good draft model's chains, or SoT-context chains that copy a
    # sibling or the corpus, accept (docs/benchmarks.md).
    # null: explore on schedule whatever the costs say (to measure acceptance where drafting
    # does not pay: studies, tests), funded or not (`ExploreFund`).
    explore_p: float | None = 0.8
    # A role (plain, skeleton, branch) is cold, and explores off schedule whether exploring is
    # funded or not, until the server has verified its drafts on this many steps. One or two
    # steps are no verdict: two early misses (chains drafted from low-confidence tokens) would
    # set the first-draft acceptance far below what the drafts accept, leave exploring
    # unfunded, and keep the server plain from then on. 0 = never explore off schedule.
    cold_verifies: int = 4
    # With a draft model: a step whose every request's recent tokens match its SoT context
    # (own text, siblings, corpus) over at least this many tokens weighs drafting from the
    # context alone, without the draft model's forwards, at the acceptance such context
    # chains have measured (compared with the committed tokens). 0 = never.
    long_match: int = 12
    # With a draft model's chain that stops by its confidence: beside each drafted token, its
    # second choice may join the verify window where the cost model says the wider verify
    # pays (`pick_runner_ups`): at batch 1 the rows are free. false = chains alone.
    runner_ups: bool = True

    def __post_init__(self) -> None:
        if not self.buckets or any(not c for _, c in self.buckets):
            raise ValueError(f"adaptive config needs at least one batch size with candidates, got {self.buckets}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"specsot.decay={self.decay} outside (0, 1]")
        if self.prior_accepts <= 0 or self.prior_misses <= 0:
            raise ValueError("specsot.prior_accepts and specsot.prior_misses must be positive")
        if not 0.0 <= self.explore_share < 1.0:
            raise ValueError(f"specsot.explore_share={self.explore_share} outside [0, 1)")
        if self.explore_p is not None and not 0.0 < self.explore_p < 1.0:
            raise ValueError(f"specsot.explore_p={self.explore_p} outside (0, 1); null explores on schedule")
        if not isinstance(self.cold_verifies, int) or isinstance(self.cold_verifies, bool) or self.cold_verifies < 0:
            raise ValueError(f"specsot.cold_verifies={self.cold_verifies!r} must be an int >= 0 (0 = never cold)")
        if not isinstance(self.long_match, int) or isinstance(self.long_match, bool) or self.long_match < 0:
            raise ValueError(f"specsot.long_match={self.long_match!r} must be an int >= 0 (0 = never)")
        if not isinstance(self.runner_ups, bool):
            raise ValueError(f"specsot.runner_ups={self.runner_ups!r} must be true or false")
        if not isinstance(self.defer_draft_extend, bool):
            raise ValueError(f"specsot.defer_draft_extend={self.defer_draft_extend!r} must be true or false")

    def candidates(self, bs: int) -> tuple[int, ...]:
        chosen = self.buckets[0][1]
        for min_bs, budgets in self.buckets:
            if bs >= min_bs:
                chosen = budgets
        return chosen

    @classmethod
    def default(cls, max_budget: int) -> AdaptiveConfig:
        """Every budget from 0 (plain) to the verify window's, at every batch size."""
        return cls(buckets=((1, tuple(range(max_budget + 1))),))

    @classmethod
    def from_json(cls, text: str, max_budget: int) -> AdaptiveConfig:
        """Parse SGLang's adaptive config; budgets above `max_budget` are refused (the window
        is sized by --speculative-num-draft-tokens)."""
        data = json.loads(text)
        buckets = []
        for key, entry in sorted(((k, v) for k, v in data.items() if k.isdigit()), key=lambda kv: int(kv[0])):
            steps = entry.get("candidate_steps")
            if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
                raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
            if max(steps) > max_budget:
                raise ValueError(
                    f"BS {key}: candidate_steps {steps} exceed {max_budget} draft tokens "
                    "(--speculative-num-draft-tokens - 1); lower them or raise that flag"
                )
            buckets.append((int(key), tuple(sorted(set(steps)))))
        if not buckets:
            raise ValueError(f'adaptive config needs a batch-size key such as {{"1": {{"candidate_steps": [0, 3]}}}}, got keys {list(data)}')
        own = data.get("specsot", {})
        known = {f.name for f in dataclasses.fields(cls)} - {"buckets"}
        unknown = sorted(set(own) - known) if isinstance(own, dict) else None
        if unknown is None or unknown:
            raise ValueError(f'"specsot" in the adaptive config takes keys {sorted(known)}, got {own!r}')
        return cls(buckets=tuple(buckets), **own)


class AcceptanceStats:
    """Decayed counts of accepted drafts and early stops, per group (a SoT group or a request).

    A group's estimate outlives its members (its later branches start from it), so keys are
    kept least-recently-observed first and the oldest go beyond `max_keys`: the server's
    memory must not grow with the number of answers it has served.

    A new group starts from what drafts of its role (the SoT tag's: plain, skeleton, branch)
    have recently earned on this server, or the server's own drafts while its role has none:
    SoT branches accept fewer drafts than normal answers, and one server-wide start would
    start a new normal answer at the branches' rate, where drafting may not pay.

    Counts decay once per step (`one_step`), not once per verify: the branches of a group
    verify together, and decayed per verify, a 5-branch group's estimate (and its role's)
    would remember only two steps, so one bad step could turn a batch plain, with nothing
    drafted to learn from and a role prior frozen at that step.
    """

    def __init__(self, config: AdaptiveConfig, max_keys: int = 4096):
        self.config = config
        self.max_keys = max_keys
        self._counts: OrderedDict[str, list[float]] = OrderedDict()  # key -> [accepted, early stops]
        self._server = [0.0, 0.0]  # the same counts over every drafted verify of the server
        self._roles: dict[str, list[float]] = {}  # and over those of each role
        self._role_of: dict[str, str | None] = {}  # key -> the role its drafts were observed as
        self._verifies: dict[str | None, int] = {}  # role (None: the server's) -> drafted verifies seen
        self._decayed: set[Hashable] | None = None  # inside `one_step`: the counts decayed in it

    @contextlib.contextmanager
    def one_step(self):
        """The observations of one step: each group's, role's and the server's counts decay
        once in it, however many of its requests observe. Outside it every observation is a
        step of its own."""
        outer, self._decayed = self._decayed, set() if self._decayed is None else self._decayed
        try:
            yield
        finally:
            self._decayed = outer

    def _decay(self, counts: list[float], name: Hashable) -> None:
        if self._decayed is not None:
            if name in self._decayed:
                return
            self._decayed.add(name)
        keep = 1.0 - self.config.decay
        counts[0] *= keep
        counts[1] *= keep

    def prior(self, role: str | None = None) -> float:
        """What a group of `role` without evidence starts from (and drifts back to): the
        recent acceptance of its role's drafts, or the server's while its role has none, itself
        starting from prior_accepts / prior_misses. A new request then drafts as much as this
        draft model has been earning here on such text, not from a blind 0.5."""
        acc, miss = self._roles[role] if role is not None and self.has_evidence(role) else self._server
        c = self.config
        return (acc + c.prior_accepts) / (acc + miss + c.prior_accepts + c.prior_misses)

    def has_evidence(self, role: str | None = None) -> bool:
        """Whether the server has verified any drafts yet, of `role` where given."""
        return self.verifies(role) > 0

    def verifies(self, role: str | None = None) -> int:
        """How many verifies of drafts the server has seen (of `role` where given): not decayed,
        a count of the evidence behind `prior`."""
        return self._verifies.get(role, 0)

    def p(self, key: str, role: str | None = None) -> float:
        """Estimated chance a drafted token is accepted, given its parent was."""
        acc, miss = self._counts.get(key, (0.0, 0.0))
        c = self.config
        weight = c.prior_accepts + c.prior_misses
        return (acc + weight * self.prior(role)) / (acc + miss + weight)

    def observe(self, key: str, budget: int, accepted: int, role: str | None = None) -> None:
        """One verify of `budget` drafts of which the first `accepted` were right."""
        counts = self._counts.setdefault(key, [0.0, 0.0])
        self._counts.move_to_end(key)
        self._role_of[key] = role
        while len(self._counts) > self.max_keys:
            self._role_of.pop(self._counts.popitem(last=False)[0], None)
        self._decay(counts, ("key", key))
        if budget > 0:
            miss = 1.0 if accepted < budget else 0.0
            counts[0] += accepted
            counts[1] += miss
            self._verifies[None] = self._verifies.get(None, 0) + 1
            if role is not None:
                self._verifies[role] = self._verifies.get(role, 0) + 1
            totals = [(self._server, ("server",))]
            if role is not None:
                totals.append((self._roles.setdefault(role, [0.0, 0.0]), ("role", role)))
            for total, name in totals:
                self._decay(total, name)
                total[0] += accepted
                total[1] += miss

    def role(self, key: str) -> str | None:
        """The role `key`'s drafts were last observed as (None: unknown or no role)."""
        return self._role_of.get(key)

    def forget(self, key: str) -> None:
        self._counts.pop(key, None)
        self._role_of.pop(key, None)

    def forget_groups(self) -> None:
        """Every group's estimate, not what the server's and each role's drafts have earned:
        that is what this draft model makes of this target's text, not cached text (a cache
        flush keeps it, as it keeps the measured costs)."""
        self._counts.clear()
        self._role_of.clear()

    def info(self) -> dict[str, float]:
        """Each group's estimate as its plans read it: against its own role's prior (a group
        with little evidence shown against the server's would differ from what it drafts by)."""
        return {key: round(self.p(key, self.role(key)), 3) for key in self._counts}

    def priors(self) -> dict[str, float]:
        """Where a new group of each role starts (roles with evidence)."""
        return {role: round(self.prior(role), 3) for role in self._roles if self.has_evidence(role)}


class ChainAcceptance:
    """A chain's acceptance as two estimates, each an `AcceptanceStats`: of its first draft
    (`first`), and of each later draft given its parent was accepted (`p`).

    One `p` for every depth (a geometric chain) fits a draft model, whose drafts are accepted
    at about the same rate at every depth (/server_info's `acceptance_by_depth` shows it).
    It does not fit drafts from the SoT context: the first token is a guess from a short
    match, while a token after an accepted one continues text that is being copied and is
    accepted more often. One `p` fitted to both would underprice the second token and cut
    chains at one token where a second pays.

    A verify of `budget` drafts of which the first `accepted` were right is a first draft
    seen (right if `accepted` >= 1) and, where that one was right and a second was drafted,
    a chain of `budget - 1` later drafts of which `accepted - 1` were right. A step without
    drafts lets both drift back to their priors (as `AcceptanceStats.observe` does).
    """

    def __init__(self, config: AdaptiveConfig, max_keys: int = 4096):
        self.config = config
        self._first = AcceptanceStats(config, max_keys)
        self._next = AcceptanceStats(config, max_keys)

    @contextlib.contextmanager
    def one_step(self):
        """`AcceptanceStats.one_step` for both estimates."""
        with self._first.one_step(), self._next.one_step():
            yield

    def first(self, key: str, role: str | None = None) -> float:
        """Estimated chance the first draft of `key`'s next chain is accepted."""
        return self._first.p(key, role)

    def p(self, key: str, role: str | None = None) -> float:
        """Estimated chance a later draft is accepted, given its parent was."""
        return self._next.p(key, role)

    def observe(self, key: str, budget: int, accepted: int, role: str | None = None) -> None:
        """One verify of `budget` drafts of which the first `accepted` were right."""
        if not 0 <= accepted <= budget:
            raise ValueError(f"accepted={accepted} outside [0, budget={budget}]")
        self._first.observe(key, min(budget, 1), min(accepted, 1), role)
        if budget == 0:
            self._next.observe(key, 0, 0, role)  # no evidence: drift back to the prior
        elif budget >= 2 and accepted >= 1:
            self._next.observe(key, budget - 1, accepted - 1, role)

    def has_evidence(self, role: str | None = None) -> bool:
        """Whether the server has verified any drafts yet (of `role` where given)."""
        return self._first.has_evidence(role)

    def verifies(self, role: str | None = None) -> int:
        """How many verifies of drafts the server has seen (of `role` where given)."""
        return self._first.verifies(role)

    def forget(self, key: str) -> None:
        self._first.forget(key)
        self._next.forget(key)

    def forget_groups(self) -> None:
        """Every group's estimates, not the server's and roles' (`AcceptanceStats.forget_groups`)."""
        self._first.forget_groups()
        self._next.forget_groups()

    def info(self) -> dict[str, dict[str, float]]:
        """Per group (newest last): {"first": ..., "p": ...} as its plans read them."""
        firsts, nexts = self._first.info(), self._next.info()
        return {
            key: {"first": first, "p": nexts.get(key, round(self.p(key, self._first.role(key)), 3))}
            for key, first in firsts.items()
        }

    def priors(self) -> dict[str, dict[str, float]]:
        """Where a new group of each role starts (roles with evidence)."""
        nexts = self._next.priors()
        return {
            role: {"first": first, "p": nexts.get(role, round(self._next.prior(role), 3))}
            for role, first in self._first.priors().items()
        }


class DepthAcceptance:
    """How often a draft at each depth of the chain was accepted, given its parent was.

    The budget model assumes one `p` for every depth; these counts show whether that holds
    (and, split by where the step's first draft token came from, whether a deferred
    draft-extend's catch-up drafts as well as an extend every step). Counts, not decayed:
    they describe the server's life, for /server_info.
    """

    def __init__(self) -> None:
        self.reached: list[int] = []  # reached[d]: steps whose chain had a draft at depth d+1 and accepted its parent
        self.accepted: list[int] = []  # accepted[d]: of those, steps that accepted it

    def observe(self, depth: int, accepted: int) -> None:
        """One verify of a chain of `depth` drafts whose first `accepted` were right."""
        if not 0 <= accepted <= depth:
            raise ValueError(f"accepted={accepted} outside [0, depth={depth}]")
        while len(self.reached) < depth:
            self.reached.append(0)
            self.accepted.append(0)
        for d in range(min(accepted + 1, depth)):
            self.reached[d] += 1
        for d in range(accepted):
            self.accepted[d] += 1

    def info(self) -> dict[str, list]:
        rates = [round(a / r, 3) if r else None for a, r in zip(self.accepted, self.reached)]
        return {"p_by_depth": rates, "reached": list(self.reached), "accepted": list(self.accepted)}


def expected_drafts_accepted(p: float, budget: int, first: float | None = None) -> float:
    """first + first*p + ... + first*p^(budget-1): accepted drafts of a chain of `budget`
    under the model, whose first draft is accepted with `first` (default `p`)."""
    first = p if first is None else first
    if budget <= 0:
        return 0.0
    if p >= 1.0:
        return first * budget
    return first * (1.0 - p**budget) / (1.0 - p)


def useful_budget(p: float, cap: int, min_token_prob: float, first: float | None = None) -> int:
    """The longest budget up to `cap` whose last token is still accepted with at least
    `min_token_prob` (first * p^(b-1); `first` defaults to `p`)."""
    first = p if first is None else first
    b = 0
    while b < cap and first * p**b >= min_token_prob:
        b += 1
    return b


class FirstDraftCalibration:
    """How often the draft model's first token is accepted, by the draft's own probability of it
    (and, where chains stop by confidence, `ChainStop`, every later token given its parent was).

    A draft model knows when it is unsure: its top-1 probability for the next token says how
    likely the target is to agree. The relayed top-k of the last draft-extend gives that
    probability before any draft forward runs, so a step can draft its full chain where the
    draft is sure and only the free first token (or nothing) where it is not. What a
    probability is worth in acceptance is learned here, per probability bin (decayed counts,
    smoothed towards the budget model's own estimate `p`), not assumed: an uninformative
    draft model calibrates every bin to the same rate and changes nothing.
    """

    EDGES = (0.3, 0.5, 0.7, 0.85, 0.95)  # bin upper edges; the last bin is [0.95, 1]

    def __init__(self, decay: float = 0.01, prior_weight: float = 4.0):
        assert 0.0 < decay <= 1.0 and prior_weight > 0.0, (decay, prior_weight)
        self.decay, self.prior_weight = decay, prior_weight
        self._counts = [[0.0, 0.0] for _ in range(len(self.EDGES) + 1)]  # [accepted, seen] per bin

    def _bin(self, q: float) -> int:
        return bisect.bisect_right(self.EDGES, q)

    def observe(self, q: float, accepted: bool) -> None:
        counts = self._counts[self._bin(q)]
        keep = 1.0 - self.decay
        counts[0] = counts[0] * keep + float(accepted)
        counts[1] = counts[1] * keep + 1.0

    def rate(self, q: float, prior: float) -> float:
        """Expected acceptance of a first draft the draft model gave probability `q`."""
        acc, seen = self._counts[self._bin(q)]
        return (acc + self.prior_weight * prior) / (seen + self.prior_weight)

    def info(self) -> dict:
        return {
            "edges": list(self.EDGES),
            "accept_rate": [round(a / n, 3) if n else None for a, n in self._counts],
            "weight": [round(n, 1) for _, n in self._counts],
        }


class ChainStop:
    """How deep a draft model's chain goes, decided between its forwards from its confidence.

    The plan sizes a chain before any draft forward runs, from each request's running
    acceptance `p` and the calibrated confidence of its first draft (the top-1 probability
    the last draft-extend left). Each further forward gives the draft's probability of the
    token it drafts, so a chain can stop where the draft turns unsure and go on where it
    stays sure. Between forwards, `go_on` weighs one more draft token for the batch: the
    expected committed tokens of the step so far against its cost (`step_ms(depth)`: the
    batch's step with `depth` drafts per request, as the plan prices it), and goes on while
    stopping deeper, at any depth up to `max_depth` (tokens not yet drafted accepted with `p`
    each given their parent was), raises tokens per ms. A drafted token's chance to be
    accepted given its parent was is the calibration's rate at the draft's probability of it
    (`FirstDraftCalibration`, which `observe`s every depth).

    Deeper, not only one deeper: a step's cost is not linear in its depth. A step's first
    draft forward carries the chain's setup, so the second draft costs more than the third;
    weighing the next token alone would stop a chain at depth 1 where depth 3 brings the
    most tokens per ms.

    Requests whose plan drafts nothing (`ps` entry with budget 0) do not count. Plain Python.
    """

    def __init__(
        self,
        ps: Sequence[float],
        first_q: Sequence[float | None],
        calibration: FirstDraftCalibration,
        step_ms: Callable[[int], float],
        min_token_prob: float,
        first_ps: Sequence[float] | None = None,
        max_depth: int | None = None,
    ) -> None:
        assert len(ps) == len(first_q), f"{len(first_q)} first drafts for {len(ps)} requests"
        assert max_depth is None or max_depth >= 1, f"max_depth {max_depth}"
        first_ps = list(ps) if first_ps is None else list(first_ps)
        assert len(first_ps) == len(ps), f"{len(first_ps)} first-draft estimates for {len(ps)} requests"
        self.ps, self.calibration, self.step_ms = list(ps), calibration, step_ms
        self.min_token_prob = min_token_prob
        self.qs: list[list[float]] = [[] if q is None else [q] for q in first_q]  # per request, by depth
        # Per request, by depth: the chance every draft up to that depth is accepted (the
        # first calibrated towards the first draft's estimate, the later ones towards `ps`).
        self.reach: list[list[float]] = [
            [] if q is None else [calibration.rate(q, f)] for q, f in zip(first_q, first_ps)
        ]
        self.tokens = len(ps) + sum(r[-1] for r in self.reach if r)  # expected committed tokens so far
        self.depth = 1
        self.max_depth = max_depth  # None: weigh one token more only

    def go_on(self) -> bool:
        """Whether stopping deeper (a token more per request, or up to `max_depth`) raises the
        step's expected tokens per ms over stopping now."""
        deepest = self.depth + 1 if self.max_depth is None else self.max_depth
        now = self.tokens / self.step_ms(self.depth)
        tokens, reach = self.tokens, [r[-1] for r in self.reach if r]
        ps = [p for r, p in zip(self.reach, self.ps) if r]
        for depth in range(self.depth + 1, deepest + 1):
            reach = [x * p for x, p in zip(reach, ps)]
            tokens += sum(reach)
            if tokens / self.step_ms(depth) > now:
                return True
        return False

    def observe(self, qs: Sequence[float]) -> None:
        """The draft's probability of the tokens it drafted at the next depth, per request."""
        assert len(qs) == len(self.reach), f"{len(qs)} probabilities for {len(self.reach)} requests"
        self.depth += 1
        for q_by_depth, reach, q, p in zip(self.qs, self.reach, qs, self.ps):
            if reach:  # a request that drafts
                q_by_depth.append(q)
                reach.append(reach[-1] * self.calibration.rate(q, p))
                self.tokens += reach[-1]

    def depths(self) -> list[int]:
        """Draft tokens each request keeps: its chain up to the last token still accepted with
        at least `min_token_prob` (at least its first; 0 for requests that draft nothing)."""
        out = []
        for reach in self.reach:
            kept = sum(1 for x in reach if x >= self.min_token_prob)  # reach only falls with depth
            out.append(min(len(reach), max(1, kept)))
        return out


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


@dataclass(frozen=True)
class StepPlan:
    """What one step drafts and verifies."""

    width: int  # verify window per request incl. the bonus row (1 = plain decode)
    budgets: tuple[int, ...]  # draft tokens per request (0 = none), each <= width - 1
    expected_tokens: float  # committed tokens the model expects from the step
    step_ms: float  # what the cost model expects the step to take

    @property
    def rate(self) -> float:
        return self.expected_tokens / self.step_ms if self.step_ms > 0 else 0.0


def plan_step(
    ps: Sequence[float],
    candidates: Sequence[int],
    step_ms: Callable[[int, int], float],
    min_token_prob: float,
    min_budget: int = 0,
    firsts: Sequence[float] | None = None,
) -> StepPlan:
    """The budget among `candidates` with the most expected tokens per ms for this batch.

    `ps`: each request's acceptance estimate; `step_ms(bs, width)`: the cost model's time of a
    step with that verify width. Verify checks one width for the whole batch, so the window
    is the chosen budget + 1 and each request drafts what pays for it within that window (its
    own last token accepted with at least `min_token_prob`); the rest of its rows are padding.
    `min_budget` is what the drafter always proposes (a draft model's chain); plain decoding
    is a candidate only when it is 0. `firsts`: each request's chance its first draft is
    accepted, where known better than `ps` (the draft model's calibrated confidence).
    """
    return best_plan(candidate_plans(ps, candidates, step_ms, min_token_prob, min_budget, firsts))


# A drafting plan within this share of the best plan's rate is "near paying": acceptance
# estimates move by about a tenth per verified step (decay 0.1), so it may pay a few steps on.
NEAR_PAYING = 0.9


def drafting_near(plans: Sequence[StepPlan], best: StepPlan) -> bool:
    """Whether some plan that drafts comes within NEAR_PAYING of `best`'s rate."""
    rates = [plan.rate for plan in plans if plan.width > 1]
    return bool(rates) and max(rates) >= NEAR_PAYING * best.rate


def best_plan(plans: Sequence[StepPlan]) -> StepPlan:
    """The plan with the most expected tokens per ms; ties go to the narrower (listed first)."""
    best: StepPlan | None = None
    for plan in plans:
        if best is None or plan.rate > best.rate * (1.0 + 1e-9):
            best = plan
    assert best is not None, "no candidate budgets"
    return best


def candidate_plans(
    ps: Sequence[float],
    candidates: Sequence[int],
    step_ms: Callable[[int, int], float],
    min_token_prob: float,
    min_budget: int = 0,
    firsts: Sequence[float] | None = None,
) -> list[StepPlan]:
    """One plan per distinct candidate budget, narrowest first (see `plan_step`)."""
    bs = len(ps)
    firsts = list(ps) if firsts is None else list(firsts)
    assert len(firsts) == bs, f"{len(firsts)} first-draft estimates for {bs} requests"
    plans = []
    for budget in sorted({max(min_budget, b) for b in candidates}):
        budgets = tuple(
            max(min_budget, useful_budget(p, budget, min_token_prob, f)) for p, f in zip(ps, firsts)
        )
        tokens = bs + sum(expected_drafts_accepted(p, b, f) for p, b, f in zip(ps, budgets, firsts))
        width = 1 + max(budgets, default=0)
        plans.append(StepPlan(width, budgets, tokens, step_ms(bs, width)))
    return plans


def explore_every(plain_ms: float, explore_ms: float, share: float) -> int:
    """Plain steps per exploring step so that exploring costs at most `share` of their time
    (0 = never explore). An exploring step costs `explore_ms` where a plain one costs `plain_ms`."""
    if share <= 0.0:
        return 0
    extra = max(0.0, explore_ms - plain_ms)
    return max(1, math.ceil(extra / (share * plain_ms))) if plain_ms > 0 else 1


def may_pay(plans: Sequence[StepPlan], margin: float) -> bool:
    """Whether some plan that drafts beats the plain plan (width 1) by more than `margin`
    (a share of its rate); without a plain plan, whether any plan drafts."""
    plain = [plan.rate for plan in plans if plan.width == 1]
    drafting = [plan.rate for plan in plans if plan.width > 1]
    if not drafting:
        return False
    return not plain or max(drafting) > (1.0 + margin) * plain[0]


def explore_plan(ps: Sequence[float], candidates: Sequence[int], step_ms: Callable[[int, int], float]) -> StepPlan:
    """Every request drafts the smallest positive candidate budget (what learning costs least)."""
    budget = min((b for b in candidates if b > 0), default=0)
    bs = len(ps)
    tokens = bs + sum(expected_drafts_accepted(p, budget) for p in ps)
    return StepPlan(budget + 1, (budget,) * bs, tokens, step_ms(bs, budget + 1))


def speedup_ceiling(
    cost: CostModel, bs: int, p_by_depth: Sequence[float], draft_model: bool, narrow_extend: bool = False,
    runner_up_hit: float = 0.0, max_width: int | None = None,
) -> tuple[float, int]:
    """The most speculation can gain over plain decoding for a batch of `bs` under `cost`,
    and the draft budget that gains it: (best tokens per ms / plain's, budget; 1.0 and 0
    when nothing beats plain).

    `p_by_depth[d]` is the chance a draft at depth d+1 is accepted given its parent was (as
    `DepthAcceptance` measures it); budgets run to its length. Every request drafts alike,
    and the step costs what the cost model says: a verify of `bs x (b + 1)` rows, with a
    draft model also b - 1 draft forwards (the first draft comes from the last extend) and
    its extend over the window (`narrow_extend`: over what the chain did not write, the bonus
    token and, when all b drafts are accepted, the last), against a plain step of `bs` rows
    that extends nothing (the extend is deferred). It is the limit of any budget policy on this machine at this
    acceptance, not a prediction: padding, attention under the tree mask and sampling over
    the window cost more than the matrix products the probe timed.

    With `runner_up_hit` (the share of verified runner-ups the target took, as /server_info's
    `runner_ups` counts them), drafted depths may also verify their runner-ups, up to
    `max_width` nodes a request, as many as pay (`pick_runner_ups`, the worker's own choice):
    a hit adds one token where the chain reached its parent (`runner_up_gains`), and only the
    verify is wider (the draft forwards and the extend are the chain's).
    """
    plain_rate = bs / cost.target.ms(bs)
    best, budget, reach, accepted = 1.0, 0, 1.0, 0.0
    reaches: list[float] = []
    for b, p in enumerate(p_by_depth, start=1):
        reach *= p
        accepted += reach
        reaches.append(reach)
        rows = bs * (1.0 + reach) if narrow_extend else None
        ms = cost.step_ms(bs, b + 1, draft_steps=b - 1 if draft_model else 0, draft_extend=draft_model, extend_rows=rows)
        tokens = bs * (1.0 + accepted)
        if runner_up_hit > 0 and max_width:
            gains = runner_up_gains(reaches, [runner_up_hit] * b)
            verify_ms = lambda w: cost.target.ms(bs * w)  # noqa: E731
            chosen = pick_runner_ups([gains] * bs, [b + 1] * bs, max_width, verify_ms, ms, tokens)
            tokens += bs * sum(gains[d - 1] for d in chosen[0])
            ms += verify_ms(b + 1 + len(chosen[0])) - verify_ms(b + 1)
        gain = (tokens / ms) / plain_rate
        if gain > best:
            best, budget = gain, b
    return best, budget


def measured_speedup_ceiling(
    step_ms: Mapping[tuple[int, int], float], bs: int, p_by_depth: Sequence[float]
) -> tuple[float, int] | None:
    """`speedup_ceiling` priced with the steps a server really ran instead of modelled
    forwards: (best tokens per ms / plain's, verify width), or None where plain steps of
    `bs` requests (`step_ms[bs, 1]`) were not measured.

    `step_ms[bs, w]` is the measured time of a step of `bs` requests verifying `w` rows each
    (`/server_info`'s `measured_step_ms`, "BSxW"). Each width is credited the tokens of a
    chain `w - 1` deep at `p_by_depth`, the most `w - 1` draft nodes bring at chain-like
    acceptance (a runner-up is worth less than the chain node it displaces while reach stays
    above the runner-ups' hit rate). The time is whatever the server's steps of that width
    cost, some with cheaper shapes (a shorter chain and runner-ups). Like the modelled
    ceiling it prices every step at the mean acceptance, so a policy that drafts more where
    a request's acceptance runs high (and less elsewhere) can beat it a little; unlike it,
    it holds what the probe does not time: attention under the tree mask, sampling over the
    window, the host between forwards.
    """
    plain = step_ms.get((bs, 1))
    if plain is None:
        return None
    best, width, reach, accepted = 1.0, 1, 1.0, 0.0
    for w, p in enumerate(p_by_depth, start=2):
        reach *= p
        accepted += reach
        ms = step_ms.get((bs, w))
        if ms is not None and (1.0 + accepted) * plain / ms > best:
            best, width = (1.0 + accepted) * plain / ms, w
    return best, width


def parse_step_table(info: Mapping[str, float]) -> dict[tuple[int, int], float]:
    """`/server_info`'s `measured_step_ms` ({"BSxW": ms}) as {(bs, w): ms}."""
    out = {}
    for key, ms in info.items():
        bs, sep, w = key.partition("x")
        if not (sep and bs.isdigit() and w.isdigit()):
            raise ValueError(f"measured step key {key!r} is not 'BSxW' (e.g. '4x2')")
        out[int(bs), int(w)] = float(ms)
    return out


def runner_up_gains(reach: Sequence[float], runner_up_ps: Sequence[float]) -> list[float]:
    """Expected tokens each depth's runner-up adds to a chain (index d - 1 for depth d).

    A runner-up (the draft's second choice where its first is the chain's token) is verified
    only where every draft above it was accepted (`reach[d - 2]`, 1 at depth 1), and is the
    target's token about as often as the draft's probability of it (docs/benchmarks.md).
    Each hit is one committed token more (the runner-up, then the bonus token after it where
    the chain's miss left only a bonus).
    """
    above = [1.0, *reach]
    return [above[d] * q for d, q in enumerate(runner_up_ps)]


def pick_runner_ups(
    gains: Sequence[Sequence[float]],
    sizes: Sequence[int],
    max_width: int,
    verify_ms: Callable[[int], float],
    step_ms: float,
    tokens: float,
    min_gain: float = 0.0,
) -> list[list[int]]:
    """Which runner-ups join the verify window: per request, the depths (1-based) chosen.

    The window is as wide as the widest request's tree and every request is verified at that
    width, so widths are weighed, not nodes: at width w each request adds its best
    `w - size` runner-ups (`gains[i]`, by depth), and the step's rate is its expected tokens
    (`tokens` plus the runner-ups') over its time (`step_ms` plus what a verify `w` wide costs
    more than one of the chains' width, `verify_ms(w)`). The width with the best rate wins;
    ties go to the narrower. Where the cost model says a wider verify costs nothing (a
    batch's rows under what a matrix product costs the same for), every runner-up that fits
    is verified: rows that are free. A runner-up worth less than `min_gain` never is (the
    worker passes `min_token_prob`, where a chain stops too): a row is not quite free."""
    assert len(gains) == len(sizes), f"{len(gains)} gain lists for {len(sizes)} requests"
    base = max(sizes, default=1)
    order = [sorted((d for d in range(len(g)) if g[d] >= min_gain and g[d] > 0), key=lambda d, g=g: -g[d]) for g in gains]
    best_rate, best_width = tokens / step_ms, base
    base_ms = verify_ms(base)
    for width in range(base + 1, max_width + 1):
        gain = sum(sum(g[d] for d in o[: max(0, width - s)]) for g, o, s in zip(gains, order, sizes))
        rate = (tokens + gain) / (step_ms + max(0.0, verify_ms(width) - base_ms))
        if rate > best_rate * (1.0 + 1e-9):
            best_rate, best_width = rate, width
    return [sorted(d + 1 for d in o[: max(0, best_width - s)]) for o, s in zip(order, sizes)]
