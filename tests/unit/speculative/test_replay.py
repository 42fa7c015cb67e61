"""Replaying an acceptance trace (SGLANG_SPECSOT_REPLAY): a worker on other weights drafts the
recorded shapes and accepts the recorded paths, step for step, with no read of its own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_specsot.speculative import replay
from sglang_specsot.speculative.draft_tree import DraftTree, pad_tree
from sglang_specsot.speculative.drafters.replay import ReplayDrafting, ReplayedProposal, forced_acceptance, replaying
from sglang_specsot.speculative.replay import TraceReplay
from sglang_specsot.speculative.trace import TraceStep, TraceWriter, read_trace
from tests.unit.speculative.builders import WINDOW, context_worker
from tests.unit.speculative.sync_counter import SyncCounter
from tests.unit.speculative.test_sync_count import _batch, _on_device, sglang_stand_ins  # noqa: F401

# Two recorded requests over four steps: branching trees, a path down a second branch, paths
# into the padding's fillers, a step that drafts nothing. A step's width is its widest tree.
STEPS = {
    "a": [((-1, 0, 0, 1, 2), 4, 5), ((-1,), 0, 3), ((-1, 0, 1, 2), 3, 4), ((-1,), 0, 1)],
    "b": [((-1, 0, 1), 4, 5), ((-1, 0, 0), 2, 3), ((-1, 0), 3, 4), ((-1,), 0, 1)],
}


def _trace() -> dict[str, list[TraceStep]]:
    def step(rid, parents, node, width):
        return TraceStep(rid, width, parents, node, TraceStep(rid, width, parents, 0, 0).padded().depth(node))

    return {rid: [step(rid, *s) for s in steps] for rid, steps in STEPS.items()}


def _shape(s: TraceStep) -> tuple:
    return s.width, s.parents, s.node, s.accepted


def test_replay_reproduces_the_trace_step_for_step(sglang_stand_ins, tmp_path):  # noqa: F811
    trace = _trace()
    assert {s.accepted for steps in trace.values() for s in steps} == {0, 1, 2, 3, 4}
    worker = context_worker(None)  # the target's argmax (PROMPT's cycle) never takes tokens 1, 2, ...
    worker.drafter = ReplayDrafting(worker.drafter, TraceReplay(trace, WINDOW))
    worker.telemetry.trace = TraceWriter(str(tmp_path / "replayed.jsonl"))
    _on_device(worker)
    counter = SyncCounter()
    batch = _batch(counter, 2)
    per_step = []
    with counter:
        for _ in range(4):
            before = len(counter.syncs)
            result = worker.forward_batch_generation(batch)
            per_step.append(len(counter.syncs) - before)
            batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = result.new_seq_lens, None, None
            batch.spec_info = result.next_draft_input
    assert per_step == [1] * 4, counter.syncs  # as a real step (test_sync_count)
    replayed = read_trace(str(tmp_path / "replayed.jsonl"))
    assert list(replayed) == ["r0", "r1"]  # live rids claim the recorded requests in order
    assert [_shape(s) for s in replayed["r0"]] == [_shape(s) for s in trace["a"]]
    assert [_shape(s) for s in replayed["r1"]] == [_shape(s) for s in trace["b"]]
    # The committed tokens are the paths' drafts, each path ending in the target's bonus: a's
    # second branch (tokens 2, 4), then its chain (1, 2, 3).
    history = worker.context.context.tokens("r0")
    assert history[-9:-7] == [2, 4] and history[-5:-2] == [1, 2, 3], history


def test_forced_acceptance_takes_the_recorded_path_and_nothing_else():
    trees = (pad_tree(DraftTree((9, 1, 2, 3, 4), (-1, 0, 0, 1, 2)), 6, 9), pad_tree(DraftTree((7,), (-1,)), 6, 7))
    verify_input = SimpleNamespace(draft_token_num=6, host_trees=trees,
                                   draft_token=torch.tensor([t for tree in trees for t in tree.tokens]))  # fmt: skip
    predict = torch.full((12,), 50, dtype=torch.int32)  # what the target chose: no draft
    proposal = ReplayedProposal(trees, "context", None, nodes=(4, 0))
    predict, lens, index = forced_acceptance(proposal, verify_input, predict)
    assert lens.tolist() == [3, 1]
    assert index.tolist() == [[0, 2, 4, -1, -1, -1], [6, -1, -1, -1, -1, -1]]
    assert predict[index[0, :3].long()].tolist() == [2, 4, 50]  # the path's drafts, then the target's bonus
    assert predict[6].item() == 50


def test_a_request_replays_its_own_rid_else_the_next_unclaimed():
    trace = _trace()
    replayer = TraceReplay(trace, WINDOW)
    assert replayer.next_steps(["x", "b"]) == [trace["a"][0], trace["b"][0]]
    assert replayer.next_steps(["y"]) == [None]  # none left: plain decoding
    for _ in range(3):
        replayer.next_steps(["x"])
    assert replayer.next_steps(["x"]) == [None]  # its steps ran out


def test_replay_needs_its_opt_in_and_room_for_the_trees(tmp_path, monkeypatch):
    path = tmp_path / "trace.jsonl"
    TraceWriter(str(path)).write(_trace()["a"])
    drafter = context_worker(None).drafter
    assert replaying(drafter, WINDOW) is drafter  # off unless asked
    monkeypatch.setenv(replay.ENV, str(path))
    with pytest.raises(ValueError, match="SGLANG_SPECSOT_REPLAY_OPT_IN=forced-acceptance"):
        TraceReplay.from_env(WINDOW)
    monkeypatch.setenv(replay.OPT_IN_ENV, replay.OPT_IN)
    assert list(TraceReplay.from_env(WINDOW).trace) == ["a"]
    assert isinstance(replaying(drafter, WINDOW), ReplayDrafting)
    with pytest.raises(ValueError, match="SoT-context drafting only"):
        replaying(SimpleNamespace(), WINDOW)  # a draft model's drafter: not replayed yet
    with pytest.raises(ValueError, match="at least 5"):
        TraceReplay.from_env(4)
