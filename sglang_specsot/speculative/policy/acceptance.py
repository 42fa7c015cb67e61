"""How often drafts are accepted: decayed estimates per SoT group and role, by depth, and the
draft model's calibrated confidence in its first token.

The acceptance model is a truncated geometric chain: a drafted token is accepted with
probability `p` given its parent was, so `b` drafts bring `p + p^2 + ... + p^b` tokens on top
of the bonus token. `p` is estimated per group from what verify accepted, and on plain steps
from what it would have accepted (shadow drafts): successes are accepted drafts, failures are
steps that stopped before the budget, decayed so that the estimate follows the text; it starts
from, and drifts back to while a group gets no drafts, the server's recent acceptance over all
groups.
"""

from __future__ import annotations

import bisect
import contextlib
from collections import OrderedDict
from collections.abc import Hashable

from sglang_specsot.speculative.policy.config import AdaptiveConfig


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
