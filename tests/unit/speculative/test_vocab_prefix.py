"""A draft whose vocabulary is a prefix of the target's is accepted, at launch (config.json
sizes, `apply_defaults`) and in the worker (loaded tokenizers, `check_vocab_compatible`); a
larger draft, or a tokenizer that maps the shared ids otherwise, is refused naming the flag and
the fix. Qwen2.5-7B (152,064 rows) with Qwen2.5-0.5B (151,936) is the pair users try first.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from sglang_specsot.host import adapter as sgl
from sglang_specsot.models.tiny import train_tokenizer
from sglang_specsot.speculative.algorithm import apply_defaults
from sglang_specsot.speculative.drafters.model import check_vocab_compatible

QWEN25_7B, QWEN25_05B = 152064, 151936


def _launch(tmp_path, target_vocab: int, draft_vocab: int):
    for name, vocab in (("target", target_vocab), ("draft", draft_vocab)):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "config.json").write_text(json.dumps({"vocab_size": vocab, "architectures": ["Qwen2ForCausalLM"]}))
    sa = SimpleNamespace(
        model_path=str(tmp_path / "target"), speculative_draft_model_path=str(tmp_path / "draft"),
        speculative_num_draft_tokens=None, speculative_eagle_topk=None, speculative_num_steps=None,
        page_size=None, max_running_requests=None, enable_mixed_chunk=True, device="cpu",
    )  # fmt: skip
    apply_defaults(sa)
    return sa


def test_vocab_prefix_qwen_7b_with_05b_draft_launches(tmp_path):
    sa = _launch(tmp_path, QWEN25_7B, QWEN25_05B)
    assert sa.speculative_num_draft_tokens == 8  # the draft-model defaults ran past the check


def test_vocab_prefix_a_larger_draft_is_refused_at_launch(tmp_path):
    with pytest.raises(ValueError) as err:
        _launch(tmp_path, QWEN25_05B, QWEN25_7B)
    message = str(err.value)
    assert "--speculative-draft-model-path=" in message and f"vocab_size is {QWEN25_7B}" in message
    assert f"the target's is {QWEN25_05B}" in message and "use a draft model with the target's tokenizer" in message


class Embedding(torch.nn.Embedding):
    """SGLang's draft models answer get_input_embeddings() with their embedding module."""


def _worker(size: int, tokenizer, embedding=None):
    runner = SimpleNamespace(
        model_config=SimpleNamespace(vocab_size=size),
        model=SimpleNamespace(get_input_embeddings=lambda: embedding),
    )  # fmt: skip
    return SimpleNamespace(model_runner=runner, draft_runner=runner, tokenizer=tokenizer,
                           draft_worker=SimpleNamespace(tokenizer=tokenizer))  # fmt: skip


@pytest.fixture
def spec(monkeypatch):
    monkeypatch.setattr(sgl, "get_spec", lambda: SimpleNamespace(speculative_draft_model_path="/draft"), raising=False)


def test_vocab_prefix_worker_accepts_the_shared_tokenizer_and_clamps_ids_past_the_draft(spec):
    tokenizer = train_tokenizer(QWEN25_7B)  # both checkpoints pad one tokenizer to their sizes
    embedding = Embedding(8, 2)
    target, draft = _worker(12, tokenizer), _worker(8, tokenizer, embedding)
    check_vocab_compatible(target, draft)
    # A committed target token past the draft's rows is read as its last row, not out of bounds.
    ids = torch.tensor([0, 7, 8, 11])
    out = embedding(ids)
    assert torch.equal(out, embedding.weight[[0, 7, 7, 7]])


def test_vocab_prefix_worker_refuses_a_tokenizer_that_disagrees_on_shared_ids(spec):
    tokenizer = train_tokenizer(1024)
    vocab = tokenizer.get_vocab()
    swapped = dict(vocab, **{"the": vocab["and"], "and": vocab["the"]})
    other = SimpleNamespace(get_vocab=lambda: swapped)
    with pytest.raises(ValueError) as err:
        check_vocab_compatible(_worker(1100, tokenizer), _worker(1024, other, Embedding(1024, 2)))
    message = str(err.value)
    assert "--speculative-draft-model-path='/draft' maps tokens to other ids" in message
    assert f"id {min(vocab['the'], vocab['and'])}" in message and "use a draft model with the target's tokenizer" in message


def test_vocab_prefix_worker_ignores_target_tokens_past_the_draft(spec):
    # The target's tokenizer may name ids the draft has no row for: they are not shared.
    draft_vocab = {"a": 0, "b": 1}
    target = SimpleNamespace(get_vocab=lambda: {"a": 0, "b": 1, "<extra>": 2})
    check_vocab_compatible(_worker(3, target), _worker(2, SimpleNamespace(get_vocab=lambda: draft_vocab), Embedding(2, 2)))


def test_vocab_prefix_worker_refuses_a_larger_draft(spec):
    tokenizer = SimpleNamespace(get_vocab=lambda: {"a": 0})
    with pytest.raises(ValueError, match="vocab_size is 9 but the target's is 8"):
        check_vocab_compatible(_worker(8, tokenizer), _worker(9, tokenizer, Embedding(9, 2)))
