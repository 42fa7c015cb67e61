"""SPECSOT's speculative input types, subclassing SGLang's EAGLE ones.

SGLang's `SpecInputType` is a closed IntEnum and attention backends compare against the EAGLE
members (flashinfer_backend.py:893, :2366), so these reuse `EAGLE_DRAFT` / `EAGLE_VERIFY` and
only add fields (all defaulted: the EAGLE dataclasses have required fields).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_specsot.host import adapter as sgl

from sglang_specsot.sot.tag import SoTTag


# The per-request tensors a draft input carries in sync mode (rows = requests).
_RELAYED = ("bonus_tokens", "topk_p", "topk_index", "hidden_states", "draft_probs")


@dataclass
class SoTDraftInput(sgl.EagleDraftInput):
    """State relayed between iterations (through FutureMap under overlap).

    Context drafting needs only `bonus_tokens` (relayed by FutureMap.stash); its draft tokens
    come from host-side token history, so `topk_p` / `topk_index` stay None. With a draft
    model they carry the top-k its last draft-extend proposed for the first draft step.
    """

    capture_hidden_mode: sgl.CaptureHiddenMode = sgl.CaptureHiddenMode.NULL

    @classmethod
    def from_bonus(cls, bonus_tokens: torch.Tensor) -> SoTDraftInput:
        return cls(bonus_tokens=bonus_tokens)

    @classmethod
    def from_eagle(cls, first: sgl.EagleDraftInput) -> SoTDraftInput:
        """SGLang's draft input after a draft model's extend, as ours (same fields)."""
        return cls(**{name: getattr(first, name) for name in _RELAYED})

    @classmethod
    def create_idle_input(cls, device, *args, **kwargs) -> SoTDraftInput:
        return cls(bonus_tokens=torch.empty((0,), device=device, dtype=torch.int32))

    def filter_batch(self, new_indices: torch.Tensor, new_indices_cpu=None) -> None:
        # Overlap: the payload lives in the FutureMap; only the slot keys move.
        if self.future_indices is not None:
            self.future_indices = self.future_indices[new_indices]
            return
        # Sync: EagleDraftInput.filter_batch would index topk_p, which context drafting
        # leaves None; slice what exists.
        for name in _RELAYED:
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value[new_indices])

    def merge_batch(self, other: SoTDraftInput) -> None:
        if self.future_indices is not None:
            assert other.future_indices is not None, "cannot merge a relayed input with a materialized one"
            self.future_indices = torch.cat([self.future_indices, other.future_indices])
            return
        if len(self.bonus_tokens) == 0:  # an idle stub takes the other side whole
            for name in _RELAYED:
                setattr(self, name, getattr(other, name))
            return
        if len(other.bonus_tokens) == 0:
            return
        for name in _RELAYED:
            mine, theirs = getattr(self, name), getattr(other, name)
            assert (mine is None) == (theirs is None), f"merging inputs that disagree on {name}"
            if mine is not None:
                setattr(self, name, torch.cat([mine, theirs]))


@dataclass
class SoTVerifyInput(sgl.EagleVerifyInput):
    """One verify window per request: a token tree merged from every configured drafter."""

    # The per-request SoT tags the drafters used (host side, one per row).
    sot_tags: tuple[SoTTag, ...] = ()
    # Longest root-to-leaf chain incl. the root; context trees are irregular.
    tree_depth: int = 1
    # The same trees on the host (DraftTree per row), for the grammar mask without readback.
    host_trees: tuple = ()

    @property
    def max_tree_depth(self) -> int:
        return self.tree_depth

    @property
    def tree_topk(self) -> int:
        return -1  # irregular tree: no fixed per-level branching (as NGRAM's)
