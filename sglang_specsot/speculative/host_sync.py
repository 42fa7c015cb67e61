"""A decode step's traffic between host and device: copies to the device that do not block
the host, and one blocking read a step, of the tokens the target committed.

A blocking read (`.tolist()`, `.item()`, `.cpu()` of a device tensor, a pageable copy to the
device) makes the host wait for everything queued on the device before it: the scheduler and
our Python stop running ahead of the GPU. SGLang's EAGLE V2 worker does none a step; SPECSOT's
drafts come from the host, so the committed tokens must come back once (`PendingCommit`), and
a draft model's tree once: where both are read in one step, the later read finds the earlier
copy done (it was queued first), so it costs no second wait.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def to_device(host: torch.Tensor, device) -> torch.Tensor:
    """`host` on `device` without making the host wait: copied from pinned memory on CUDA (a
    pageable copy blocks until the driver has staged it); elsewhere `host` itself (a CPU "copy"
    is none, and only CUDA can pin)."""
    if torch.device(device).type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


@dataclass(frozen=True)
class Committed:
    """What one verify committed, on the host: per request its verify row of tokens from the
    root, of which the first `lens[b]` are committed (the rest are garbage)."""

    rows: list[list[int]]  # per request, n tokens (n: the step's verify width)
    lens: list[int]  # per request, its accept length (>= 1: the bonus token at least)


class PendingCommit:
    """A verify's committed tokens on their way to the host: the copy is queued at verify end,
    read (`settle`) when the host needs them, by which time a later blocking read may already
    have waited for it."""

    def __init__(self, accept_lens: torch.Tensor, next_token_ids: torch.Tensor, width: int):
        bs = accept_lens.shape[0]
        # One tensor, so one copy: column 0 the accept length, then the verify row.
        packed = torch.cat([accept_lens.view(bs, 1).to(torch.int64), next_token_ids.view(bs, width).to(torch.int64)], dim=1)
        # Pinned where the device can copy into it without the host (CUDA); a CPU run copies
        # the same way, so one path serves both (a few hundred ints).
        self.host = torch.empty(packed.shape, dtype=torch.int64, pin_memory=packed.is_cuda)
        self.host.copy_(packed, non_blocking=True)
        self.done = None
        if packed.is_cuda:
            self.done = torch.cuda.Event()
            self.done.record()

    @classmethod
    def of(cls, result) -> PendingCommit:
        """The committed tokens of a verify's `GenerationBatchResult`."""
        return cls(result.accept_lens, result.next_token_ids, result.speculative_num_draft_tokens)

    def settle(self) -> Committed:
        """The committed tokens on the host; waits for the copy only if nothing has yet."""
        if self.done is not None and not self.done.query():
            self.done.synchronize()
        table = self.host.tolist()
        return Committed(rows=[row[1:] for row in table], lens=[row[0] for row in table])


def read_committed(result) -> Committed:
    """A verify's committed tokens on the host now: the step's one blocking read."""
    return PendingCommit.of(result).settle()
