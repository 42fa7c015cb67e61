"""Paired-token radix keys for SPECSOT with a draft model (host change
`draft-model-bigram-radix-keys`).

SGLang's draft worker reads its input one token ahead (eagle_worker_v2.py:991, STANDALONE's
draft model as EAGLE's head): the draft's KV slot p holds token p + 1. A radix prefix matched
on single tokens, [0, c), therefore reuses at slot c - 1 the draft KV of the token that
followed the prefix in the request that cached it, not of this request's token c. Every later
draft attends to that slot: greedy output is unchanged (verify decides), acceptance is not. On
a server that answers with SoT, every branch but the first reuses the shared prompt this way.

SGLang keys its radix tree by token pairs where the draft is EAGLE's (`is_eagle`,
radix_cache.py:401; sglang PR #10846): a match of c pairs guarantees token c too, so slot
c - 1 is right. The invariant here: a SPECSOT server that drafts with a draft model builds its
tree cache with pair keys as well. SPECSOT with an EAGLE head has them already (`is_eagle()`);
context-only SPECSOT writes no draft KV.
"""

from __future__ import annotations

from sglang_specsot.speculative.algorithm import NAME, configured_draft_kind
from sglang_specsot.speculative.draft_kind import DraftKind


def drafts_one_ahead_with_model(server_args) -> bool:
    """Whether this server is SPECSOT drafting with a draft model (whose draft reads ahead)."""
    return server_args.speculative_algorithm == NAME and configured_draft_kind() is DraftKind.MODEL


def create_tree_cache_around(original, ctx):
    """AROUND hook on `create_tree_cache` (mem_cache/registry.py:223): SPECSOT with a draft
    model gets the tree cache SGLang builds for EAGLE's draft, keyed by token pairs; every
    other server's is built as SGLang builds it. `ctx.params` is the builder's own object
    (kv_cache_builder.py:389), set as the upstream diff sets it, so whatever else reads it
    after the tree is built reads the same flag."""
    if not ctx.params.is_eagle and not ctx.params.disable and drafts_one_ahead_with_model(ctx.server_args):
        ctx.params.is_eagle = True
    return original(ctx)
