"""Draft token trees: the host-side shape one verify window checks, and how to build one.

Plain Python (no torch, no SGLang); the worker turns a `DraftTree` into SGLang tensors.
"""

from __future__ import annotations

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

    @property
    def height(self) -> int:
        """Edges on the longest root-to-leaf path (0 for a lone root)."""
        depth = [0] * self.size
        for i in range(1, self.size):
            depth[i] = depth[self.parents[i]] + 1
        return max(depth)

    def first_chain(self) -> list[int]:
        """Tokens below the root along each node's first child: a best-first builder's
        likeliest path."""
        first_child: dict[int, int] = {}
        for node in range(1, self.size):
            first_child.setdefault(self.parents[node], node)
        out, node = [], 0
        while node in first_child:
            node = first_child[node]
            out.append(self.tokens[node])
        return out

    def accepted(self, truth: list[int]) -> int:
        """Drafts greedy verify keeps: the longest root path equal to a prefix of `truth`
        (the target's own next tokens)."""
        children = {(p, t): i for i, (p, t) in enumerate(zip(self.parents, self.tokens)) if i}
        node, n = 0, 0
        while n < len(truth) and (node, truth[n]) in children:
            node, n = children[(node, truth[n])], n + 1
        return n

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


@dataclass
class TreeBuilder:
    """A token tree grown node by node under a budget; siblings always carry distinct tokens."""

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


def with_runner_ups(chain: DraftTree, runner_ups: dict[int, int]) -> DraftTree:
    """`chain` (nodes in chain order: node d is its draft at depth d) with each
    `runner_ups[d]` token beside its draft at depth d, as a leaf under depth d - 1's node.

    A runner-up is the draft's second choice where its first is drafted: verify accepts it
    where the target's token is that one, one token more than the chain's miss would leave.
    It is never a parent: the draft ran no forward from it. A runner-up equal to the chain's
    token there (none, for a top-2) would give a node two children of one token, which tree
    sampling does not allow, so it is left out."""
    assert all(chain.parents[i] == i - 1 for i in range(1, chain.size)), "runner-ups go beside a chain"
    assert all(1 <= d < chain.size for d in runner_ups), f"runner-up depths {sorted(runner_ups)} outside the chain"
    builder = TreeBuilder(budget=chain.size - 1 + len(runner_ups))
    for i, token in enumerate(chain.tokens):
        builder.add_node(token, i - 1)
    for depth, token in sorted(runner_ups.items()):
        if token != chain.tokens[depth]:
            builder.add_node(token, depth - 1)
    return builder.to_bfs_tree()


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
