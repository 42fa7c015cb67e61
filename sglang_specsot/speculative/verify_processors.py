"""Custom logit processors at verify: each request's processor on every row of its tree.

SGLang's EAGLE verify never calls custom logit processors, so a constrained request would
decode unconstrained under speculation. This mirrors SGLang's own calling convention
(`apply_custom_logit_processor`, sampler.py:1019-1068: one call per processor with the rows
it owns and one `custom_params` dict per row, result written back row for row), with one
difference that verify needs: each row is a tree node, so its dict's `"__req__"` shows the
request as it would be had the drafted path to that node been accepted.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import torch

from sglang_specsot.speculative.draft_tree import DraftTree


class NodeReq:
    """A request seen from one tree node: `output_ids` runs through that node's drafted
    path; every other attribute is the request's own."""

    __slots__ = ("_req", "output_ids")

    def __init__(self, req, output_ids) -> None:
        self._req = req
        self.output_ids = output_ids

    def __getattr__(self, name: str):
        return getattr(self._req, name)


def node_output_ids(history: Sequence[int], prompt_len: int, tree: DraftTree) -> list[list[int]]:
    """Output ids up to each node: the committed output (root included) plus the drafted
    path below the root. `history` is prompt + committed output, as the drafter keeps it."""
    committed = list(history[prompt_len:])
    paths = (tree.ancestors_or_self(node)[1:] for node in range(tree.size))
    return [committed + [tree.tokens[j] for j in path] for path in paths]


def _node_params(params: dict[str, Any] | None, req, history: Sequence[int], tree: DraftTree) -> list:
    if not isinstance(params, dict):  # SGLang hands such rows their params (None) as they are
        return [params] * tree.size
    prompt_len = len(req.origin_input_ids_unpadded)
    typecode = req.output_ids.typecode if isinstance(req.output_ids, array) else None
    rows = []
    for ids in node_output_ids(history, prompt_len, tree):
        output_ids = array(typecode, ids) if typecode else ids  # processors concatenate them
        rows.append({**params, "__req__": NodeReq(req, output_ids)})
    return rows


def apply_verify_processors(
    logits: torch.Tensor,
    sampling_info,
    reqs: Sequence,
    trees: Sequence[DraftTree],
    histories: Sequence[Sequence[int]],
) -> None:
    """Apply every request's custom logit processor to its verify rows, in place.

    `logits`: shape (bs * n, vocab), request-major, node order within a request (as
    `eagle_sample` reads them); `trees[i]` has n nodes; `histories[i]` is request i's
    prompt and committed output, the tree's root token last.
    """
    bs = len(reqs)
    n = logits.shape[0] // max(bs, 1)
    assert logits.shape[0] == bs * n and all(t.size == n for t in trees), (
        f"verify logits have {logits.shape[0]} rows for {bs} trees of {[t.size for t in trees]} nodes"
    )
    assert len(sampling_info.custom_params) == bs == len(histories), (
        f"{len(sampling_info.custom_params)} custom params and {len(histories)} histories "
        f"for {bs} requests"
    )
    offsets = torch.arange(n, device=logits.device)
    for entry in sampling_info.custom_logit_processor.values():
        indices = (entry.indices.to(logits.device)[:, None] * n + offsets).flatten()
        params = [
            p for r in entry.rows
            for p in _node_params(sampling_info.custom_params[r], reqs[r], histories[r], trees[r])
        ]  # fmt: skip
        selected = logits.index_select(0, indices)
        result = entry.processor(selected, params)
        logits.index_copy_(0, indices, result.to(logits.dtype))
