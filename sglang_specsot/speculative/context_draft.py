"""Draft tokens from the SoT context: the request's own prompt and output, its siblings', and
a corpus of finished requests.

A SoT branch's prompt holds the question and the whole skeleton, and its siblings are writing
about the same question in the same voice at the same time, so their text is the best cheap
predictor of what this branch writes next. Siblings decode in lockstep, though, so none is
far ahead of the others; finished requests (earlier groups, earlier answers) supply the
model's habitual phrasing, as SGLang's NGRAM corpus does. No second model is needed.

Every earlier occurrence of the request's recent tokens votes for the tokens that followed it,
weighted by how long the match is; the votes form a trie, and the tree drafted is the
best-scoring subtree that fits the node budget.

Plain Python (no torch, no SGLang): the worker turns a `DraftTree` into SGLang tensors.
"""

from __future__ import annotations

import bisect
import heapq
from collections import OrderedDict
from dataclasses import dataclass

from sglang_specsot.speculative.draft_tree import DraftTree, TreeBuilder, pad_tree, tree_mask

__all__ = ["ContextDraftConfig", "ContextDrafter", "DraftTree", "TokenIndex", "pad_tree", "tree_mask"]


class TokenIndex:
    """A growing token sequence with an n-gram -> end-positions index, updated per token.

    Only n-grams up to `key_len` are indexed; longer matches are measured by comparing
    backwards from a short key's occurrence, so the index stays small however long the
    matches we score.
    """

    def __init__(self, key_len: int):
        self.key_len = key_len
        self.tokens: list[int] = []
        self._where: dict[tuple[int, ...], list[int]] = {}

    def extend(self, new_tokens: list[int]) -> None:
        for t in new_tokens:
            self.tokens.append(t)
            end = len(self.tokens)
            for k in range(1, min(self.key_len, end) + 1):
                self._where.setdefault(tuple(self.tokens[end - k : end]), []).append(end)

    def matches(self, suffix: list[int], min_len: int, max_len: int, limit: int) -> list[tuple[int, int]]:
        """(end, match length) of up to `limit` earlier occurrences of the tail of `suffix`
        that have a continuation.

        Keys are tried longest first, newest occurrence first, so short (weak) matches only
        fill what long ones leave and the cost is bounded however frequent a token is. A
        match length is the common tail of `suffix` and `tokens[:end]`, capped at `max_len`.
        """
        out: list[tuple[int, int]] = []
        seen: set[int] = set()
        size, toks = len(self.tokens), self.tokens
        for k in range(min(self.key_len, len(suffix), max_len), min_len - 1, -1):
            for end in reversed(self._where.get(tuple(suffix[-k:]), ())):
                if len(out) == limit:
                    return out
                if end >= size or end in seen:
                    continue  # no continuation yet, or already found with a longer key
                seen.add(end)
                out.append((end, _common_tail(toks, end, suffix, k, max_len)))
        return out


def _common_tail(toks: list[int], end: int, suffix: list[int], known: int, cap: int) -> int:
    """Length (at most `cap`) of the common tail of `toks[:end]` and `suffix`, whose last
    `known` tokens are known to agree; binary search on slice equality, which runs in C."""
    lo, hi = known, min(cap, end, len(suffix))
    if lo >= hi or toks[end - lo - 1] != suffix[-lo - 1]:
        return lo  # the common case, without building slices
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if toks[end - mid : end] == suffix[len(suffix) - mid :]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Votes:
    """A trie of candidate continuations, each node carrying the summed weight of the
    occurrences whose continuation passes through it (the root is node 0)."""

    def __init__(self) -> None:
        self.tokens: list[int] = [-1]
        self.weight: list[float] = [0.0]
        self.depth: list[int] = [0]
        self.children: list[dict[int, int]] = [{}]

    def add(self, path: tuple[int, ...], weight: float) -> None:
        node = 0
        for t in path:
            nxt = self.children[node].get(t)
            if nxt is None:
                nxt = len(self.tokens)
                self.tokens.append(t)
                self.weight.append(0.0)
                self.depth.append(self.depth[node] + 1)
                self.children.append({})
                self.children[node][t] = nxt
            self.weight[nxt] += weight
            node = nxt

    def best_first(self, decay: float):
        """(parent, node) pairs by falling score weight * decay**depth; parents come first.

        Under a model where a node is right with probability proportional to its weight, and
        each step deeper is right with probability `decay` given its parent, the first k pairs
        are the k-node tree with the most expected accepted tokens. A child never outscores
        its parent (its weight is part of the parent's), so the prefix is always a tree.
        """
        heap = [(-self.weight[c] * decay, c, 0) for c in self.children[0].values()]
        heapq.heapify(heap)
        while heap:
            _, node, parent = heapq.heappop(heap)
            yield parent, node
            for c in self.children[node].values():
                heapq.heappush(heap, (-self.weight[c] * decay ** self.depth[c], c, node))


_CORPUS_PROMPT_TAIL = 16  # prompt tokens kept before a request's output in the corpus


class _Corpus:
    """Finished requests' output, one index over all of them, kept up to a token budget.

    SGLang's NGRAM keeps such a corpus over every request; answers to similar prompts repeat
    the model's phrasing (and a repeated prompt repeats its answer). One shared index keeps
    the drafting cost independent of how many requests it holds. Two generations give a soft
    eviction: when the newer one is full it becomes the older one and the oldest is dropped.
    """

    SEPARATOR = -1  # between requests: matches nothing, so no match crosses a boundary

    def __init__(self, key_len: int, max_tokens: int):
        self.key_len, self.max_tokens = key_len, max_tokens
        self.generations: list[tuple[TokenIndex, list[int], list[str]]] = []  # newest last
        self._rotate()

    def _rotate(self) -> None:
        # Each generation: its index, where each request's span starts, and whose span it is.
        self.generations = self.generations[-1:] + [(TokenIndex(self.key_len), [], [])]

    def add(self, tokens: list[int], owner: str) -> None:
        """Append one request's tokens (a request longer than a generation fills one alone)."""
        if self.max_tokens == 0 or not tokens:
            return
        index, starts, owners = self.generations[-1]
        if index.tokens and len(index.tokens) + len(tokens) > self.max_tokens // 2:
            self._rotate()
            index, starts, owners = self.generations[-1]
        starts.append(len(index.tokens))
        owners.append(owner)
        index.extend(list(tokens) + [self.SEPARATOR])

    def matches(self, suffix: list[int], skip_owner: str, min_len: int, max_len: int, limit: int):
        """(index, end, match length) as `TokenIndex.matches` per generation, leaving out
        `skip_owner`'s spans (the asking request's group, whose members vote as siblings)."""
        for index, starts, owners in self.generations:
            for end, length in index.matches(suffix, min_len, max_len, limit):
                if owners[bisect.bisect_right(starts, end - 1) - 1] != skip_owner:
                    yield index, end, length


@dataclass(frozen=True)
class ContextDraftConfig:
    """How the context drafter scores what it finds; validated once.

    Every earlier occurrence of the request's recent tokens (in its own prompt and output, its
    SoT siblings', and finished requests') votes for the tokens that followed it. A vote weighs
    more the longer the match (a long shared context predicts much better than one shared
    token). The defaults were chosen with `examples/simulate_context_draft.py`; accept length
    is flat around them (match_power 1..3, depth_decay 0.5..0.8, source weights 0.25..2).
    """

    min_ngram: int = 1  # shortest match that may vote
    max_ngram: int = 32  # matches longer than this weigh as this
    key_len: int = 3  # n-grams indexed; longer matches are measured by comparison
    per_source: int = 8  # occurrences taken per source (a corpus generation counts as one)
    match_power: float = 2.0  # a vote weighs match_length ** match_power
    depth_decay: float = 0.8  # expected chance a drafted token is right given its parent is
    sibling_weight: float = 1.0  # vote factor for a SoT sibling's tokens
    corpus_weight: float = 0.5  # vote factor for finished requests' tokens
    corpus_tokens: int = 1 << 17  # finished requests' tokens kept as a shared corpus (0: none)
    # Tokens of finished SoT branches (and skeletons) kept whole as sibling context, oldest
    # evicted first: a group's later branches draft from them, but an index costs a few
    # hundred bytes per token, so keeping every finished group would grow the server's memory
    # with the number of SoT answers served.
    finished_sibling_tokens: int = 1 << 16

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram <= 256:
            raise ValueError(
                f"context drafting needs 1 <= min_ngram <= max_ngram <= 256, got "
                f"min_ngram={self.min_ngram}, max_ngram={self.max_ngram}"
            )
        if not 1 <= self.key_len <= 8:
            raise ValueError(f"key_len must be in 1..8, got {self.key_len}")
        if self.per_source < 1:
            raise ValueError(f"per_source must be >= 1, got {self.per_source}")
        if not 0.0 < self.depth_decay <= 1.0:
            raise ValueError(f"depth_decay must be in (0, 1], got {self.depth_decay}")
        for name in ("match_power", "sibling_weight", "corpus_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("corpus_tokens", "finished_sibling_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


class ContextDrafter:
    """Proposes draft trees for requests from their own, their SoT siblings' and finished requests' tokens."""

    def __init__(self, config: ContextDraftConfig | None = None, max_groups: int = 1024):
        self.config = config or ContextDraftConfig()
        self.max_groups = max_groups
        self._seqs: dict[str, TokenIndex] = {}
        self._group_of: dict[str, str] = {}
        # group id -> member rids, oldest group first; finished members stay as context.
        self._groups: OrderedDict[str, list[str]] = OrderedDict()
        self._corpus = _Corpus(self.config.key_len, self.config.corpus_tokens)
        self._output_from: dict[str, int] = {}  # rid -> where its tokens enter the corpus
        # Grouped requests that left, oldest first, with their token counts: kept as sibling
        # context within `config.finished_sibling_tokens`.
        self._finished: OrderedDict[str, int] = OrderedDict()
        self._finished_tokens = 0

    # -- bookkeeping -----------------------------------------------------------------------

    def sizes(self) -> dict[str, int]:
        """What the drafter keeps, each bounded by its config (for /server_info's memory)."""
        return {
            "requests": len(self._seqs),  # running ones and finished SoT members kept
            "groups": len(self._groups),
            "finished_sibling_tokens": self._finished_tokens,
            "corpus_tokens": sum(len(index.tokens) for index, _, _ in self._corpus.generations),
        }

    def has(self, rid: str) -> bool:
        return rid in self._seqs

    def start(self, rid: str, tokens: list[int], group: str | None = None) -> None:
        """(Re)start a request with its committed tokens (prompt plus any output)."""
        self._discard(rid)  # a restart's earlier tokens are a prefix of `tokens`: not corpus
        self._unfinish(rid)  # a retracted request comes back through prefill
        index = TokenIndex(self.config.key_len)
        index.extend(list(tokens))
        self._seqs[rid] = index
        # Its output joins the corpus with a little prompt before it, so that the first
        # tokens of a later answer can match the prompt's closing tokens (the chat template).
        self._output_from[rid] = max(0, len(tokens) - 1 - _CORPUS_PROMPT_TAIL)
        if group is not None:
            self._join_group(rid, group)

    def append(self, rid: str, tokens: list[int]) -> None:
        self._seqs[rid].extend(tokens)

    def tokens(self, rid: str) -> list[int]:
        return self._seqs[rid].tokens

    def forget(self, rid: str) -> None:
        """A request left: its output joins the corpus; grouped ones stay as sibling context."""
        index = self._seqs.get(rid)
        if index is None:
            return
        start = self._output_from.pop(rid, None)
        if start is not None:
            self._corpus.add(index.tokens[start:], owner=self._group_of.get(rid, rid))
        if rid not in self._group_of:
            del self._seqs[rid]
        else:
            self._finish(rid, len(index.tokens))

    def _finish(self, rid: str, size: int) -> None:
        """Keep a grouped request's text for its siblings, within the finished-tokens budget."""
        self._unfinish(rid)
        self._finished[rid] = size
        self._finished_tokens += size
        while self._finished_tokens > self.config.finished_sibling_tokens:
            old, old_size = self._finished.popitem(last=False)
            self._finished_tokens -= old_size
            self._drop_member(old)

    def _unfinish(self, rid: str) -> None:
        size = self._finished.pop(rid, None)
        if size is not None:
            self._finished_tokens -= size

    def _drop_member(self, rid: str) -> None:
        """Remove a request from its group (and the group once it has no members left)."""
        group = self._group_of.get(rid)
        self._release(rid)
        members = self._groups.get(group) if group is not None else None
        if members is not None:
            members.remove(rid)
            if not members:
                del self._groups[group]

    def _release(self, rid: str) -> None:
        """Everything kept for a grouped request, except its place in its group's list."""
        self._group_of.pop(rid, None)
        self._seqs.pop(rid, None)
        self._output_from.pop(rid, None)
        self._unfinish(rid)

    def _discard(self, rid: str) -> None:
        self._output_from.pop(rid, None)
        if rid not in self._group_of:
            self._seqs.pop(rid, None)

    def _join_group(self, rid: str, group: str) -> None:
        self._group_of[rid] = group
        members = self._groups.setdefault(group, [])
        if rid not in members:  # a restart rejoins once
            members.append(rid)
        self._groups.move_to_end(group)
        while len(self._groups) > self.max_groups:
            _, old_members = self._groups.popitem(last=False)
            for old in old_members:
                self._release(old)

    def siblings(self, rid: str) -> list[str]:
        group = self._group_of.get(rid)
        if group is None:
            return []
        return [r for r in self._groups.get(group, ()) if r != rid and r in self._seqs]

    def _sources(self, rid: str) -> list[tuple[TokenIndex, float]]:
        """The request's own index and its siblings', with their vote factors."""
        out = [(self._seqs[rid], 1.0)]
        if self.config.sibling_weight > 0:
            out += [(self._seqs[s], self.config.sibling_weight) for s in self.siblings(rid)]
        return out

    # -- drafting --------------------------------------------------------------------------

    def match_length(self, rid: str) -> int:
        """The longest match (at most max_ngram) of the request's recent tokens in its own
        earlier text, its SoT siblings' or the corpus, among the occurrences a proposal
        would weigh: how strongly the context alone predicts what comes next."""
        return max((length for _, _, length, _ in self._occurrences(rid)), default=0)

    def _occurrences(self, rid: str):
        """(tokens, end, match length, vote factor) of each earlier occurrence of the request's
        recent tokens that a proposal weighs: in its own text and its siblings', then (with a
        corpus weight) in finished requests' outside its group, which vote as siblings."""
        cfg = self.config
        suffix = self._seqs[rid].tokens[-cfg.max_ngram :]
        for source, factor in self._sources(rid):
            for end, length in source.matches(suffix, cfg.min_ngram, cfg.max_ngram, cfg.per_source):
                yield source.tokens, end, length, factor
        if cfg.corpus_weight > 0:
            mine = self._group_of.get(rid, rid)
            for index, end, length in self._corpus.matches(suffix, mine, cfg.min_ngram, cfg.max_ngram, cfg.per_source):
                yield index.tokens, end, length, cfg.corpus_weight

    def propose(self, rid: str, num_nodes: int, seed: DraftTree | None = None) -> DraftTree:
        """A tree of at most `num_nodes` nodes rooted at the request's last token.

        `seed` (e.g. a draft model's tree for this request, same root) goes in first, whole;
        context candidates fill what is left of the budget, best score first, sharing the
        seed's nodes where they agree.
        """
        own = self._seqs[rid]
        assert own.tokens, f"request {rid} has no tokens to draft from"
        tree = TreeBuilder(budget=num_nodes - 1)
        tree.add_node(own.tokens[-1], -1)
        if seed is not None:
            assert seed.tokens[0] == own.tokens[-1], (
                f"request {rid}: seed tree root {seed.tokens[0]} is not the last token {own.tokens[-1]}"
            )
            assert seed.size <= num_nodes, f"seed of {seed.size} nodes exceeds {num_nodes}"
            for path in seed.leaf_paths():
                tree.insert_path(path)
        if tree.full:
            return tree.to_bfs_tree()
        votes = self._votes(rid, depth=num_nodes - 1)
        placed = {0: 0}  # vote-trie node -> tree node
        for parent, node in votes.best_first(self.config.depth_decay):
            token, at = votes.tokens[node], placed[parent]
            child = tree.children[at].get(token)
            if child is None:
                if tree.full:
                    break
                child = tree.add_node(token, at)
            placed[node] = child
        return tree.to_bfs_tree()

    def _votes(self, rid: str, depth: int) -> _Votes:
        """Each match of the request's recent tokens votes for the `depth` tokens after it."""
        ballots: dict[tuple[int, ...], float] = {}  # equal continuations are counted once, summed
        for tokens, end, length, factor in self._occurrences(rid):
            path = tuple(tokens[end : end + depth])
            if _Corpus.SEPARATOR in path:  # only the corpus holds separators: stop at its request's end
                path = path[: path.index(_Corpus.SEPARATOR)]
            ballots[path] = ballots.get(path, 0.0) + factor * length**self.config.match_power
        votes = _Votes()
        for path, weight in ballots.items():
            votes.add(path, weight)
        return votes
