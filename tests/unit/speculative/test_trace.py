"""The acceptance trace (SGLANG_SPECSOT_TRACE): its format, the accepted node found from the
committed tokens, and a worker's steps recorded with no blocking read of their own."""

from __future__ import annotations

import pytest

from sglang_specsot.speculative import trace
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.trace import TraceStep, TraceWriter, accepted_node, read_trace, steps_of
from tests.unit.speculative.builders import context_worker
from tests.unit.speculative.sync_counter import SyncCounter
from tests.unit.speculative.test_sync_count import STEPS, _batch, _on_device, sglang_stand_ins  # noqa: F401

# Root 10; children 11 (node 1) and 12 (node 2); 13 under 11 (node 3), 14 under 12 (node 4).
BRANCHED = DraftTree((10, 11, 12, 13, 14), (-1, 0, 0, 1, 2))


def test_accepted_node_follows_the_committed_branch():
    assert accepted_node(BRANCHED, 5, [99], 1) == 0  # the bonus token alone
    assert accepted_node(BRANCHED, 5, [11, 13, 99], 3) == 3
    assert accepted_node(BRANCHED, 5, [12, 14, 99], 3) == 4  # the second branch, not the first chain
    assert accepted_node(BRANCHED, 5, [12, 99, 0], 2) == 2  # rows past the accept length are garbage


def test_accepted_node_runs_into_the_padding():
    # Padded to 7 the fillers (the root's token) hang below node 4: nodes 5 and 6.
    assert accepted_node(BRANCHED, 7, [12, 14, 10, 10, 99], 5) == 6


def test_steps_round_trip_through_the_file(tmp_path):
    steps = steps_of(["a", "b"], [BRANCHED, DraftTree((3,), (-1,))], 6, [[12, 14, 1, 0, 0, 0], [4] * 6], [3, 1])
    assert [(s.node, s.accepted) for s in steps] == [(4, 2), (0, 0)]
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(str(path))
    writer.write(steps)
    writer.write(steps[:1])
    assert read_trace(str(path)) == {"a": [steps[0], steps[0]], "b": [steps[1]]}
    assert path.read_text().splitlines()[1] == '{"rid": "b", "width": 6, "parents": [-1], "node": 0, "accepted": 0}'


def test_a_step_whose_accepted_length_is_not_its_node_depth_is_refused():
    with pytest.raises(AssertionError, match="not at depth"):
        TraceStep("a", 5, BRANCHED.parents, 4, 1)
    with pytest.raises(AssertionError, match="outside width"):
        TraceStep("a", 5, BRANCHED.parents, 5, 3)


def test_worker_traces_every_request_step_without_a_read_of_its_own(sglang_stand_ins, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv(trace.ENV, str(tmp_path / "trace.jsonl"))
    worker = context_worker(None)  # the whole window every step
    worker.telemetry.trace = TraceWriter.from_env()
    _on_device(worker)
    counter, bs = SyncCounter(), 3
    batch = _batch(counter, bs)
    per_step, results = [], []
    with counter:
        for _ in range(STEPS):
            before = len(counter.syncs)
            result = worker.forward_batch_generation(batch)
            per_step.append(len(counter.syncs) - before)
            results.append(result)
            batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = result.new_seq_lens, None, None
            batch.spec_info = result.next_draft_input
    assert per_step == [1] * STEPS, counter.syncs  # as without the trace (test_sync_count)
    recorded = read_trace(str(tmp_path / "trace.jsonl"))
    assert list(recorded) == ["r0", "r1", "r2"]
    for b, rid in enumerate(recorded):
        steps = recorded[rid]
        assert [s.width for s in steps] == [r.speculative_num_draft_tokens for r in results]
        assert [s.accepted + 1 for s in steps] == [int(r.accept_lens[b]) for r in results]
    assert max(s.accepted for s in recorded["r0"]) > 0  # the prompt repeats: drafts were accepted
