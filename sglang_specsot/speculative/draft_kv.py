"""Which KV slots hold the draft model's KV: the record that lets a prompt's draft-extend wait.

With a draft model, the target's and the draft's KV share slot ids (SGLang's STANDALONE
layout), and SGLang extends the draft over every slot the target writes, so a prefix the
radix cache shares holds both. Once the draft's prefill and plain steps' extends may be
deferred (ExtendBacklog), a request can finish with positions the draft never extended, and
its slots enter the radix cache all the same; a later request sharing that prefix must
know. So every committed slot is marked: valid where the draft extended it, invalid where
a deferral left it. A request's draft KV is consistent only up to its first invalid
position (the draft's KV at a position is computed from every position before it), so its
backlog starts there.

Only the worker that defers (a CPU-drafted adaptive chain) keeps this record; with eager
draft-extends, as in SGLang, every slot is valid by construction.
"""

from __future__ import annotations

import torch


def range_slots(req_to_token: torch.Tensor, pool_indices: list[int], ranges: list[tuple[int, int]]) -> torch.Tensor:
    """The KV slots of positions [start, end) of each request (its req_to_token row), in order,
    as int64 (SGLang's out_cache_loc layout of an extend over those positions)."""
    parts = [req_to_token[row, start:end] for row, (start, end) in zip(pool_indices, ranges)]
    return torch.cat(parts).to(torch.int64) if parts else torch.empty(0, dtype=torch.int64)


class DraftKVSlots:
    """One flag per KV slot: does the draft's KV there follow the text the target's holds?"""

    def __init__(self, num_slots: int, device: torch.device | str = "cpu"):
        # Nothing is valid until the draft writes it; every slot the target writes is
        # then marked by the step that wrote it (prefill, verify) one way or the other.
        self.valid = torch.zeros(num_slots, dtype=torch.bool, device=device)

    def mark(self, req_to_token: torch.Tensor, pool_indices: list[int], ranges: list[tuple[int, int]], valid: bool):
        """Mark the slots of positions [start, end) of each request (its req_to_token row)."""
        self.mark_slots(range_slots(req_to_token, pool_indices, ranges), valid)

    def mark_slots(self, slots: torch.Tensor, valid: bool) -> None:
        self.valid[slots.to(device=self.valid.device, dtype=torch.int64)] = valid

    def behind(self, req_to_token: torch.Tensor, pool_index: int, length: int) -> int:
        """How many of the request's first `length` positions lie at or after its first
        position whose slot lacks the draft's KV (0: the draft holds them all)."""
        if length == 0:
            return 0
        flags = self.valid[req_to_token[pool_index, :length].to(device=self.valid.device, dtype=torch.int64)]
        missing = torch.nonzero(~flags)
        return 0 if missing.numel() == 0 else length - int(missing[0, 0])
