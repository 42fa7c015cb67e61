"""The draft model's confidence in its first token: kept from SGLang's draft-extend, whose
top-1 path otherwise leaves topk_p = 1.0."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_specsot.host import adapter
from sglang_specsot.speculative.model_draft import RunnerUps, SoTDraftModel


class _Runner:
    def __init__(self, logits):
        self.logits = logits

    def forward(self, batch):
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=self.logits))


def test_kept_forward_logits_sees_each_forward_and_restores_the_runner():
    runner = _Runner(torch.zeros(2, 3))
    with adapter.kept_forward_logits(runner) as kept:
        runner.forward(None)
        runner.forward(None)
    assert len(kept) == 2 and "forward" not in vars(runner)  # the class method is back
    with pytest.raises(RuntimeError), adapter.kept_forward_logits(runner):
        raise RuntimeError("a failing draft-extend")
    assert "forward" not in vars(runner)


def test_stoppable_forwards_skips_every_forward_after_go_on_says_no():
    calls, asked, seen = [], [], []

    class Counting(_Runner):
        def forward(self, batch):
            calls.append(batch)
            return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=torch.full((1, 3), float(batch))))

    runner = Counting(None)
    answers = iter([True, False])

    def go_on():
        asked.append(len(calls))
        return next(answers)

    with adapter.stoppable_forwards(runner, go_on, seen.append):
        outs = [runner.forward(i) for i in range(5)]
    # The first forward runs unasked; the second is asked for (yes), the third refused, and
    # nothing is asked or run after that: the last real output comes back instead.
    assert calls == [0, 1] and asked == [1, 2]
    assert [o.logits_output.next_token_logits[0, 0].item() for o in outs] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert len(seen) == 2 and "forward" not in vars(runner)


class _Draft(SoTDraftModel):
    """SoTDraftModel's confidence path over a fake SGLang draft-extend."""

    keeps = True

    @property
    def keeps_confidence(self) -> bool:
        return self.keeps

    def draft_extend_for_decode(self, batch, result):
        # SGLang's eager path: forward, select one row per request, argmax, topk_p = 1.0.
        out = self.draft_runner.forward(batch).logits_output
        out.next_token_logits = out.next_token_logits[batch.select]
        index = out.next_token_logits.argmax(-1, keepdim=True)
        result.next_draft_input.topk_index, result.next_draft_input.topk_p = index, torch.ones_like(index, dtype=torch.float32)


def test_a_draft_extend_leaves_the_drafts_probability_of_its_top_token():
    draft = _Draft.__new__(_Draft)
    logits = torch.tensor([[0.0, 0.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    draft.draft_runner = _Runner(logits)
    batch = SimpleNamespace(select=torch.tensor([1, 3]))  # the last row of each request's window
    result = SimpleNamespace(next_draft_input=SimpleNamespace())
    draft._draft_extend(batch, result)
    top = result.next_draft_input
    assert top.topk_index.flatten().tolist() == [0, 2]
    expected = [torch.softmax(logits[1], -1)[0].item(), torch.softmax(logits[3], -1)[2].item()]
    assert top.topk_p.flatten().tolist() == pytest.approx(expected)
    draft.keeps = False  # not asked for (or a tree, or rejection sampling): SGLang's 1.0 stays
    draft._draft_extend(batch, result)
    assert result.next_draft_input.topk_p.flatten().tolist() == [1.0, 1.0]


def test_runner_ups_are_kept_from_each_extend_and_each_draft_forward():
    draft = _Draft.__new__(_Draft)
    draft.runner_ups = RunnerUps()
    logits = torch.tensor([[0.0, 0.0, 0.0], [5.0, 0.0, 2.0], [0.0, 0.0, 0.0], [0.0, 3.0, 1.0]])
    draft.draft_runner = _Runner(logits)
    batch = SimpleNamespace(select=torch.tensor([1, 3]), reqs=[SimpleNamespace(rid="a"), SimpleNamespace(rid="b")])
    draft._draft_extend(batch, SimpleNamespace(next_draft_input=SimpleNamespace()))
    a, b = torch.softmax(logits[1], -1), torch.softmax(logits[3], -1)
    assert draft.runner_ups.first["a"][:2] == (0, 2) and draft.runner_ups.first["a"][2] == pytest.approx(a[2].item())
    assert draft.runner_ups.first["b"][:2] == (1, 2) and draft.runner_ups.first["b"][2] == pytest.approx(b[2].item())
    # A draft forward's rows: the drafted token's probability for ChainStop, the runner-up kept.
    top1 = draft._seen(logits[[1, 3]])
    assert top1 == pytest.approx([a[0].item(), b[1].item()])
    assert [t for t, _ in draft.runner_ups.by_forward[0]] == [2, 2]
    draft.runner_ups.forget("a")
    assert "a" not in draft.runner_ups.first and "b" in draft.runner_ups.first
