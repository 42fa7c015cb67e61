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


def shared_backlog(
    req_to_token: torch.Tensor, pool_indices: list[int], ends: list[int], behind: list[int]
) -> list[int]:
    """Per request, how many leading positions of its backlog (positions [end - behind, end))
    an earlier request of the same list also has behind, in the same KV slots.

    SoT branches share their prompt's prefix through the radix cache: the same slots at the
    same positions, and so the same tokens before them. When that prefix was prefilled
    without the draft (a deferred prefill), every branch is behind from its start, and a
    catch-up that extends each over its whole backlog writes the prefix's draft KV once per
    branch, where once in all would do. A request's shared positions are a prefix of its
    backlog (a slot shared at a position means the whole prefix before it is shared); its
    last position is never counted (a request's last committed token is its own slot, and
    every request extends at least one row in a catch-up pass).

    One slot stays approximate: SGLang's standalone draft reads its input one token ahead
    (eagle_worker_v2.py:991), so the draft's KV at the last shared position holds the next
    token, where the branches differ. The radix cache shares that slot all the same (its
    keys are bigrams only for EAGLE, radix_cache.py:401), so one branch's value stands
    there, here the first's (were every branch to extend it in one pass, whichever write
    landed last would stand). The drafts it feeds stay lossless (verify decides).
    """
    claimed = torch.empty(0, dtype=torch.int64, device=req_to_token.device)
    shared = []
    for row, end, lag in zip(pool_indices, ends, behind):
        if lag == 0:
            shared.append(0)
            continue
        slots = req_to_token[row, end - lag : end].to(torch.int64)
        hit = torch.isin(slots[:-1], claimed)
        missing = torch.nonzero(~hit)
        n = int(hit.numel()) if missing.numel() == 0 else int(missing[0, 0])
        shared.append(n)
        claimed = torch.cat([claimed, slots[n:]])
    return shared


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
