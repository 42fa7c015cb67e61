"""Draft tokens from the SoT context: the request's own prompt and output, and its siblings'.

A SoT branch's prompt holds the question and the whole skeleton, and its siblings are writing
about the same question in the same voice at the same time, so their text is the best cheap
predictor of what this branch writes next. No second model is needed.

Plain Python (no torch, no SGLang): the worker turns a `DraftTree` into SGLang tensors.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DraftTree:
    """One request's proposal: a token tree in BFS order; node 0 is the root (last token)."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]  # parents[0] == -1; parents[i] < i

    def __post_init__(self) -> None:
        assert len(self.tokens) == len(self.parents) >= 1, "a tree needs at least its root"
        assert self.parents[0] == -1, "node 0 must be the root"
        assert all(0 <= p < i for i, p in enumerate(self.parents) if i), "parents precede children"

    @property
    def size(self) -> int:
        return len(self.tokens)

    def depth(self, node: int) -> int:
        d = 0
        while self.parents[node] != -1:
            node, d = self.parents[node], d + 1
        return d

    def leaf_paths(self) -> list[list[int]]:
        """Token paths from below the root to each leaf, in node order."""
        has_child = set(self.parents[1:])
        return [
            [self.tokens[n] for n in self.ancestors_or_self(leaf)[1:]]
            for leaf in range(1, self.size)
            if leaf not in has_child
        ]

    def ancestors_or_self(self, node: int) -> list[int]:
        chain = []
        while node != -1:
            chain.append(node)
            node = self.parents[node]
        return chain[::-1]


class TokenIndex:
    """A growing token sequence with an n-gram -> end-positions index, updated per token."""

    def __init__(self, max_ngram: int):
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self._where: dict[tuple[int, ...], list[int]] = {}

    def extend(self, new_tokens: list[int]) -> None:
        for t in new_tokens:
            self.tokens.append(t)
            end = len(self.tokens)
            for k in range(1, min(self.max_ngram, end) + 1):
                self._where.setdefault(tuple(self.tokens[end - k : end]), []).append(end)

    def continuations(self, key: tuple[int, ...], length: int, limit: int) -> list[list[int]]:
        """Up to `limit` non-empty continuations of `key`, newest occurrence first."""
        out: list[list[int]] = []
        for end in reversed(self._where.get(key, ())):
            cont = self.tokens[end : end + length]
            if cont:
                out.append(cont)
                if len(out) == limit:
                    break
        return out


@dataclass
class _Trie:
    budget: int  # nodes allowed besides the root
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    children: list[dict[int, int]] = field(default_factory=list)

    def add_node(self, token: int, parent: int) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.children.append({})
        if parent >= 0:
            self.children[parent][token] = len(self.tokens) - 1
        return len(self.tokens) - 1

    @property
    def full(self) -> bool:
        return len(self.tokens) - 1 >= self.budget

    def insert_path(self, path: list[int]) -> None:
        node = 0
        for t in path:
            nxt = self.children[node].get(t)
            if nxt is None:
                if self.full:
                    return
                nxt = self.add_node(t, node)
            node = nxt

    def to_bfs_tree(self) -> DraftTree:
        # Insertion order is depth-first per path; verify wants parents before children,
        # which BFS order guarantees.
        order, queue = [], [0]
        while queue:
            node = queue.pop(0)
            order.append(node)
            queue.extend(self.children[node].values())
        new_id = {old: new for new, old in enumerate(order)}
        tokens = tuple(self.tokens[o] for o in order)
        parents = tuple(-1 if o == 0 else new_id[self.parents[o]] for o in order)
        return DraftTree(tokens, parents)


@dataclass(frozen=True)
class ContextDraftConfig:
    """How hard the context drafter looks; validated once."""

    max_ngram: int = 4  # longest suffix matched
    min_ngram: int = 1  # shortest suffix matched
    paths_per_source: int = 2  # continuations taken per (source, n-gram length)

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram <= 16:
            raise ValueError(
                f"context drafting needs 1 <= min_ngram <= max_ngram <= 16, got "
                f"min_ngram={self.min_ngram}, max_ngram={self.max_ngram}"
            )
        if self.paths_per_source < 1:
            raise ValueError(f"paths_per_source must be >= 1, got {self.paths_per_source}")


class ContextDrafter:
    """Proposes draft trees for requests from their own and their SoT siblings' tokens."""

    def __init__(self, config: ContextDraftConfig | None = None, max_groups: int = 1024):
        self.config = config or ContextDraftConfig()
        self.max_groups = max_groups
        self._seqs: dict[str, TokenIndex] = {}
        self._group_of: dict[str, str] = {}
        # group id -> member rids, oldest group first; finished members stay as context.
        self._groups: OrderedDict[str, list[str]] = OrderedDict()

    # -- bookkeeping -----------------------------------------------------------------------

    def has(self, rid: str) -> bool:
        return rid in self._seqs

    def start(self, rid: str, tokens: list[int], group: str | None = None) -> None:
        """(Re)start a request with its committed tokens (prompt plus any output)."""
        self.forget(rid)
        index = TokenIndex(self.config.max_ngram)
        index.extend(list(tokens))
        self._seqs[rid] = index
        if group is not None:
            self._join_group(rid, group)

    def append(self, rid: str, tokens: list[int]) -> None:
        self._seqs[rid].extend(tokens)

    def tokens(self, rid: str) -> list[int]:
        return self._seqs[rid].tokens

    def forget(self, rid: str) -> None:
        """Drop a request that left without a group (grouped ones stay as sibling context)."""
        if rid in self._seqs and rid not in self._group_of:
            del self._seqs[rid]

    def _join_group(self, rid: str, group: str) -> None:
        self._group_of[rid] = group
        members = self._groups.setdefault(group, [])
        members.append(rid)
        self._groups.move_to_end(group)
        while len(self._groups) > self.max_groups:
            _, old_members = self._groups.popitem(last=False)
            for old in old_members:
                self._group_of.pop(old, None)
                self._seqs.pop(old, None)

    def siblings(self, rid: str) -> list[str]:
        group = self._group_of.get(rid)
        if group is None:
            return []
        return [r for r in self._groups.get(group, ()) if r != rid and r in self._seqs]

    # -- drafting --------------------------------------------------------------------------

    def propose(self, rid: str, num_nodes: int, seed: DraftTree | None = None) -> DraftTree:
        """A tree of at most `num_nodes` nodes rooted at the request's last token.

        `seed` (e.g. a draft model's tree for this request, same root) goes in first, whole;
        context candidates fill what is left of the budget, sharing the seed's nodes where
        they agree.
        """
        own = self._seqs[rid]
        assert own.tokens, f"request {rid} has no tokens to draft from"
        trie = _Trie(budget=num_nodes - 1)
        trie.add_node(own.tokens[-1], -1)
        if seed is not None:
            assert seed.tokens[0] == own.tokens[-1], (
                f"request {rid}: seed tree root {seed.tokens[0]} is not the last token {own.tokens[-1]}"
            )
            assert seed.size <= num_nodes, f"seed of {seed.size} nodes exceeds {num_nodes}"
            for path in seed.leaf_paths():
                trie.insert_path(path)
        sources = [own] + [self._seqs[s] for s in self.siblings(rid)]
        cfg = self.config
        for k in range(min(cfg.max_ngram, len(own.tokens)), cfg.min_ngram - 1, -1):
            key = tuple(own.tokens[-k:])
            for source in sources:
                for path in source.continuations(key, num_nodes - 1, cfg.paths_per_source):
                    trie.insert_path(path)
                    if trie.full:
                        return trie.to_bfs_tree()
        return trie.to_bfs_tree()


def tree_mask(tree: DraftTree, size: int) -> list[list[bool]]:
    """`size` x `size` ancestor-or-self mask; rows past the tree see only themselves."""
    mask = [[False] * size for _ in range(size)]
    for i in range(size):
        for j in tree.ancestors_or_self(i) if i < tree.size else [i]:
            mask[i][j] = True
    return mask


def pad_tree(tree: DraftTree, size: int, filler: int) -> DraftTree:
    """Pad to exactly `size` nodes with a chain of `filler` tokens below the last node.

    Verify needs the same node count for every request. A filler is verified like any draft,
    so accepting it is still exact. It hangs in a chain (each filler the only child of its
    parent) because tree sampling assumes the siblings of a node carry distinct tokens: the
    last BFS node is a leaf, so no filler ever gets a sibling, and BFS order is kept.
    """
    assert tree.size <= size, f"tree of {tree.size} nodes does not fit {size}"
    extra = size - tree.size
    parents = tuple(range(tree.size - 1, size - 1))[:extra]
    return DraftTree(tree.tokens + (filler,) * extra, tree.parents + parents)
