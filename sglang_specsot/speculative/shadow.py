"""Shadow drafts: what a drafting step would have accepted, learned from plain steps for free.

The budget policy's acceptance estimates learn only from what verify accepts, so a batch whose
plan has gone plain must pay to learn again (exploring). Drafts from the SoT context cost no
forward to propose: on a plain step the worker proposes the tree it would have verified, and
this module walks it down the tokens the target then commits, one step after another, as
verify would have (greedy verify accepts the longest path of the tree that the target's
tokens follow; sampled verify accepts a draft with the target's probability of it, which is
the chance the sampled token equals it). When the walk leaves the tree, the shadow is one
observation `(height, accepted)` for the estimates, priced nowhere.

Plain Python (no torch, no SGLang).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sglang_specsot.speculative.draft_tree import DraftTree


@dataclass
class _Walk:
    height: int  # of the tree: what a verify of it could have accepted at most
    children: dict[int, dict[int, int]]  # node -> {token: child}
    node: int = 0
    accepted: int = 0


class ShadowDrafts:
    """Pending shadow trees per request, each walked by the tokens committed after it."""

    def __init__(self, max_pending: int = 8):
        # A walk ends within its height in committed tokens, and each step commits at least
        # one, so a request holds about `height` walks; the bound is for safety.
        self.max_pending = max_pending
        self._walks: dict[str, deque[_Walk]] = {}
        self.proposed = 0  # shadows started (trees with at least one draft)

    def add(self, rid: str, tree: DraftTree) -> None:
        """A tree proposed at the request's current last token (its root), not verified."""
        if tree.size <= 1:
            return  # nothing drafted: nothing to learn
        children: dict[int, dict[int, int]] = {}
        for node in range(1, tree.size):
            children.setdefault(tree.parents[node], {})[tree.tokens[node]] = node
        walks = self._walks.setdefault(rid, deque(maxlen=self.max_pending))
        walks.append(_Walk(tree.height, children))
        self.proposed += 1

    def advance(self, rid: str, tokens: list[int]) -> list[tuple[int, int]]:
        """Feed the tokens the target committed after the request's last step; return the
        `(height, accepted)` of every shadow whose walk ended."""
        walks = self._walks.get(rid)
        if not walks:
            return []
        done: list[tuple[int, int]] = []
        for token in tokens:
            still = deque(maxlen=self.max_pending)
            for walk in walks:
                child = walk.children.get(walk.node, {}).get(token)
                if child is not None:
                    walk.node, walk.accepted = child, walk.accepted + 1
                    if walk.node in walk.children:
                        still.append(walk)
                        continue
                done.append((walk.height, walk.accepted))
            walks = still
        if walks:
            self._walks[rid] = walks
        else:
            self._walks.pop(rid, None)
        return done

    def forget(self, rid: str) -> None:
        self._walks.pop(rid, None)

    def clear(self) -> None:
        self._walks.clear()

    def pending(self) -> int:
        return sum(len(w) for w in self._walks.values())
