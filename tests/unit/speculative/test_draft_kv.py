"""Which KV slots hold the draft's KV: deferred prefills and steps, and radix-shared prefixes."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang_specsot.speculative.draft_kv import DraftKVSlots, shared_backlog
from sglang_specsot.speculative.drafters.model_extend import DeferredExtend
from sglang_specsot.speculative.extend_backlog import ExtendBacklog


def _pool(rows: dict[int, list[int]], width: int = 16) -> torch.Tensor:
    """A req_to_token table: row -> the slots of its positions 0, 1, ..."""
    table = torch.zeros((max(rows) + 1, width), dtype=torch.int32)
    for row, slots in rows.items():
        table[row, : len(slots)] = torch.tensor(slots, dtype=torch.int32)
    return table


def test_nothing_is_valid_until_the_draft_writes_it():
    kv = DraftKVSlots(32)
    table = _pool({0: [5, 6, 7, 8]})
    assert kv.behind(table, 0, 4) == 4 and kv.behind(table, 0, 0) == 0
    kv.mark(table, [0], [(0, 3)], valid=True)
    assert kv.behind(table, 0, 4) == 1  # position 3 (slot 8) lacks it
    kv.mark(table, [0], [(3, 4)], valid=True)
    assert kv.behind(table, 0, 4) == 0


def test_a_request_is_behind_from_its_first_invalid_position():
    # The draft's KV at a position is computed from every position before it: a valid slot
    # after an invalid one (a shared suffix extended over a stale prefix) does not count.
    kv = DraftKVSlots(32)
    table = _pool({0: [1, 2, 3, 4, 5]})
    kv.mark(table, [0], [(0, 5)], valid=True)
    kv.mark_slots(torch.tensor([3]), valid=False)  # position 2
    assert kv.behind(table, 0, 5) == 3


def test_a_shared_prefix_left_unextended_puts_the_next_request_behind_from_there():
    kv = DraftKVSlots(64)
    # Request A: prompt of 6 tokens in slots 10..15, prefilled without the draft (deferred),
    # then 2 plain steps deferred too (slots 16, 17); it finishes, and its slots stay in the
    # radix cache.
    table = _pool({0: list(range(10, 18))})
    kv.mark_slots(torch.arange(10, 16), valid=False)
    kv.mark(table, [0], [(6, 8)], valid=False)
    # Request B shares A's first 6 tokens (radix hit) and adds 3 of its own (slots 30..32).
    table = _pool({0: list(range(10, 18)), 1: [*range(10, 16), 30, 31, 32]})
    kv.mark_slots(torch.tensor([30, 31, 32]), valid=False)  # B's prefill, deferred
    assert kv.behind(table, 1, 9) == 9  # all of it: the shared prefix never got draft KV
    # B catches up (the draft extends positions 0..9); C then shares B's prompt.
    kv.mark(table, [1], [(0, 9)], valid=True)
    table = _pool({0: list(range(10, 18)), 1: [*range(10, 16), 30, 31, 32], 2: [*range(10, 16), 30, 31, 32, 40]})
    kv.mark_slots(torch.tensor([40]), valid=False)
    assert kv.behind(table, 2, 10) == 1  # only its own new token


def _deferring(num_slots: int = 64) -> DeferredExtend:
    """A draft model's deferred extend; only its backlog and slots are read here."""
    return DeferredExtend(SimpleNamespace(topk=1), None, ExtendBacklog(), None, num_slots, "cpu", timed=False)


def test_a_deferred_prefill_marks_its_slots_and_starts_each_backlog_where_the_draft_stops():
    deferred = _deferring()
    table = _pool({0: [*range(10, 16), 30, 31], 1: [20, 21, 22]})
    deferred.draft_kv.mark(table, [0], [(0, 6)], valid=True)  # request a's cached prefix: extended
    batch = SimpleNamespace(
        reqs=[SimpleNamespace(rid="a"), SimpleNamespace(rid="b")],
        req_pool_indices=torch.tensor([0, 1]),
        seq_lens=torch.tensor([8, 3]),  # spec-V2: the prompt, before the sampled token
        out_cache_loc=torch.tensor([30, 31, 20, 21, 22]),  # the prefill's new slots
        req_to_token_pool=SimpleNamespace(req_to_token=table),
    )
    deferred.defer_prefill(batch)
    assert deferred.backlog.lag(["a", "b"]) == [2, 3]
    assert deferred.backlog.info()["deferred_prefills"] == 2


def test_a_step_marks_its_committed_tokens_as_the_extend_went():
    deferred = _deferring()
    table = _pool({0: [1, 2, 3, 4, 5, 6]})
    deferred.draft_kv.mark(table, [0], [(0, 3)], valid=True)
    batch = SimpleNamespace(
        req_pool_indices=torch.tensor([0]), seq_lens=torch.tensor([3]),
        req_to_token_pool=SimpleNamespace(req_to_token=table),
    )  # fmt: skip
    deferred._mark_step(batch, SimpleNamespace(new_seq_lens=torch.tensor([5])), valid=False)  # deferred
    assert deferred.draft_kv.behind(table, 0, 5) == 2
    deferred._mark_step(batch, SimpleNamespace(new_seq_lens=torch.tensor([5])), valid=True)  # extended
    assert deferred.draft_kv.behind(table, 0, 5) == 0


def test_branches_behind_over_a_shared_prefix_extend_it_once():
    # Three SoT branches share a 6-token prefix (slots 10..15), prefilled without the draft,
    # then 2 tokens each of their own. The first extends the prefix; the others only their own.
    table = _pool({0: [*range(10, 16), 20, 21], 1: [*range(10, 16), 30, 31], 2: [*range(10, 16), 40, 41]})
    assert shared_backlog(table, [0, 1, 2], [8, 8, 8], [8, 8, 8]) == [0, 6, 6]
    # A request current up to its own tokens shares nothing; one behind only on its own
    # tokens shares nothing either.
    assert shared_backlog(table, [0, 1, 2], [8, 8, 8], [8, 0, 2]) == [0, 0, 0]
    # The order of the batch decides who extends the prefix.
    assert shared_backlog(table, [2, 0], [8, 8], [8, 8]) == [0, 6]


def test_a_request_never_shares_its_last_position():
    # Identical slots to the end (not a live SGLang layout, but the rule holds): every
    # request still extends one row, the pass's top-k for it.
    table = _pool({0: [1, 2, 3], 1: [1, 2, 3]})
    assert shared_backlog(table, [0, 1], [3, 3], [3, 3]) == [0, 2]


def test_only_a_leading_run_of_shared_slots_counts():
    # Request 1 is behind from position 4, where its slots are its own: nothing shared, even
    # though request 0's backlog also covers positions 0..3.
    table = _pool({0: [1, 2, 3, 4, 5, 6], 1: [1, 2, 3, 4, 9, 10]})
    assert shared_backlog(table, [0, 1], [6, 6], [6, 2]) == [0, 0]
    assert shared_backlog(table, [0, 1], [6, 6], [6, 4]) == [0, 2]
