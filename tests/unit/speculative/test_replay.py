"""Replaying an acceptance trace (SGLANG_SPECSOT_REPLAY): a worker on other weights drafts the
recorded shapes and accepts the recorded paths, step for step, with no read of its own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_specsot.speculative import replay
from sglang_specsot.speculative.draft_tree import DraftTree, pad_tree
from sglang_specsot.speculative.drafters import replay as drafters_replay
from sglang_specsot.speculative.drafters.replay import ReplayDrafting, ReplayedProposal, forced_acceptance, replaying
from sglang_specsot.speculative.replay import TraceReplay
from sglang_specsot.speculative.trace import TraceStep, TraceWriter, read_trace
from sglang_specsot.speculative.policy.config import AdaptiveConfig
from tests.unit.speculative.builders import WINDOW, context_worker, draft_model, model_worker
from tests.unit.speculative.sync_counter import SyncCounter
from tests.unit.speculative.test_sync_count import PROMPT, DraftModel, _batch, _on_device, drive, sglang_stand_ins  # noqa: F401

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
    with counter:
        per_step = drive(worker, batch, counter, steps=4)
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


def test_a_tagged_rid_replays_its_recorded_request_again_on_every_pass():
    trace = _trace()
    replayer = TraceReplay(trace, WINDOW)
    assert replayer.next_steps(["a@warm", "b"]) == [trace["a"][0], trace["b"][0]]
    # Each pass's tag is a new live request: a again from its first step, while a@warm goes on.
    assert replayer.next_steps(["a@m0", "a@warm"]) == [trace["a"][0], trace["a"][1]]
    assert replayer.next_steps(["b@m0"]) == [trace["b"][0]]  # b was claimed by its own rid: again all the same
    assert replayer.next_steps(["y"]) == [None]  # a was taken by its tags: nothing left unclaimed


def test_a_tagged_rid_of_an_unrecorded_request_decodes_plainly_and_takes_nothing():
    trace = _trace()
    replayer = TraceReplay(trace, WINDOW)
    assert replayer.next_steps(["zz@m0", "untraced-1@m0"]) == [None, None]  # not a's or b's steps
    assert replayer.next_steps(["y"]) == [trace["a"][0]]  # both still unclaimed


def test_a_rid_with_the_separator_that_is_itself_recorded_claims_itself():
    trace = {"a@1": _trace()["a"], "a": _trace()["b"]}
    assert replay.repeated_rid("a@1", trace) is None and replay.repeated_rid("a@2", trace) == "a"
    assert replay.repeated_rid("x@y@z", {"x@y": []}) == "x@y"  # split at the last separator
    assert replay.repeated_rid("plain-rid", trace) is None
    assert TraceReplay(trace, WINDOW).next_steps(["a@1"]) == [trace["a@1"][0]]


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
    assert isinstance(replaying(SimpleNamespace(), WINDOW), ReplayDrafting)  # a draft model's drafter too
    with pytest.raises(ValueError, match="at least 5"):
        TraceReplay.from_env(4)


# Chains a draft model drafts to the recorded sizes, with accepted lengths shorter than the
# target (PROMPT's cycle, which the fake draft model always matches) would accept.
MODEL_STEPS = {"a": [(4, 2), (2, 1), (3, 0), (1, 0)], "b": [(2, 0), (4, 3), (1, 0), (3, 2)]}


def _chain_trace() -> dict[str, list[TraceStep]]:
    widths = [max(MODEL_STEPS[r][i][0] for r in MODEL_STEPS) for i in range(4)]
    return {rid: [TraceStep(rid, w, tuple(range(-1, size - 1)), k, k) for (size, k), w in zip(steps, widths)]
            for rid, steps in MODEL_STEPS.items()}  # fmt: skip


def _replay_with_model(tmp_path, variable_steps: bool) -> tuple[dict, list[int], list[int]]:
    """The re-recorded trace, blocking reads per step and r0's history of a draft model's replay."""
    model = DraftModel(**vars(draft_model(max_steps=3, variable_steps=variable_steps, keeps_confidence=False)))
    worker = model_worker(AdaptiveConfig.default(WINDOW - 1), model, deferred=False)
    worker.drafter = ReplayDrafting(worker.drafter, TraceReplay(_chain_trace(), WINDOW))
    worker.telemetry.trace = TraceWriter(str(tmp_path / "replayed.jsonl"))
    _on_device(worker)
    counter = SyncCounter()
    batch = _batch(counter, 2)
    prefill = SimpleNamespace(next_draft_input=batch.spec_info)
    model.extend_after_verify(batch, prefill)  # the top-k a prefill's extend relays
    batch.spec_info = prefill.next_draft_input
    with counter:
        per_step = drive(worker, batch, counter, steps=4)
        worker.settle()
    return read_trace(str(tmp_path / "replayed.jsonl")), per_step, worker.context.context.tokens("r0")


def test_replay_with_a_draft_model_reproduces_the_trace(sglang_stand_ins, tmp_path):  # noqa: F811
    trace = _chain_trace()
    replayed, _, history = _replay_with_model(tmp_path, variable_steps=True)
    assert [_shape(s) for s in replayed["r0"]] == [_shape(s) for s in trace["a"]]
    assert [_shape(s) for s in replayed["r1"]] == [_shape(s) for s in trace["b"]]
    # What was committed is the draft model's own chain (PROMPT's cycle), cut where the trace says.
    assert history[len(PROMPT) :] == [7, 8, 5, 6, 7, 8, 5], history  # 3 + 2 + 1 + 1 tokens


def test_a_draft_model_replay_without_the_forcing_accepts_what_the_target_chose(sglang_stand_ins, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(drafters_replay, "with_nodes", lambda proposal, nodes: proposal)  # no forced path
    replayed, _, _ = _replay_with_model(tmp_path, variable_steps=True)
    trace = _chain_trace()
    assert [s.width for s in replayed["r0"]] == [s.width for s in trace["a"]]  # the recorded budgets still
    assert [s.accepted for s in replayed["r0"]] == [3, 1, 2, 0] != [s.accepted for s in trace["a"]]


def test_a_draft_model_replay_waits_once_a_step(sglang_stand_ins, tmp_path):  # noqa: F811
    # A fixed chain (as with draft graphs on a GPU) is drafted whole: wider than a shorter
    # recorded tree, its acceptance forced all the same, with no read more than a real step's.
    replayed, per_step, _ = _replay_with_model(tmp_path, variable_steps=False)
    assert per_step == [1] * 4
    assert [s.width for s in replayed["r1"]] == [4] * 4  # the draft's whole chain (3 drafts), every step
    assert [s.accepted for s in replayed["r1"]] == [s.accepted for s in _chain_trace()["b"]]
