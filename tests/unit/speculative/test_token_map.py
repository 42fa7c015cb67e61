"""The draft's hot vocabulary (speculative/token_map.py) and its cut LM head (model_draft.py)."""

from __future__ import annotations

import collections

import pytest
import torch
from sglang_specsot.speculative.model_draft import hot_vocab_head
from sglang_specsot.speculative.token_map import (
    check_token_map, hot_ids, mix, shipped_map_path, text_counts, word_counts,
)  # fmt: skip


def test_hot_ids_keep_special_tokens_then_the_most_frequent_then_fill_in_id_order():
    counts = collections.Counter({7: 5.0, 3: 9.0, 8: 5.0, 42: 100.0})  # 42 is outside a vocab of 10
    assert hot_ids(counts, 4, 10, always=[9]) == [3, 7, 8, 9]  # 9, then 3, then 7 and 8 (tie: lower id)
    assert hot_ids(counts, 6, 10, always=[9]) == [0, 1, 3, 7, 8, 9]  # the rest from id 0 up


def test_hot_ids_refuse_sizes_they_cannot_fill():
    with pytest.raises(ValueError, match="size 11 must be in 1..10"):
        hot_ids(collections.Counter(), 11, 10)
    with pytest.raises(ValueError, match="smaller than the 3 special tokens"):
        hot_ids(collections.Counter(), 2, 10, always=[1, 2, 3])


def test_sources_weigh_the_same_whatever_their_length():
    long = collections.Counter({1: 1000.0})
    short = collections.Counter({2: 1.0, 3: 1.0})
    assert mix([long, short]) == {1: 1.0, 2: 0.5, 3: 0.5}


def test_words_count_in_their_running_text_forms():
    ids: dict[str, int] = {}  # one token per distinct text, never two texts on one id
    tokens = lambda text: [ids.setdefault(text, len(ids))]  # noqa: E731
    counts = word_counts(tokens, [("cat", 10.0)])
    assert counts[ids[" cat"]] == pytest.approx(8.0)
    assert counts[ids[" Cat"]] == pytest.approx(1.0)
    assert sum(counts.values()) == pytest.approx(10.0)
    assert text_counts(lambda t: list(t), ["aab"]) == {"a": 2, "b": 1}


def test_check_token_map_names_what_is_wrong():
    check_token_map(torch.tensor([0, 5, 9]), 10)
    with pytest.raises(ValueError, match=r"ids 0..10 outside the draft's vocabulary 0..9"):
        check_token_map(torch.tensor([0, 10]), 10)
    with pytest.raises(ValueError, match="1 repeated token ids"):
        check_token_map(torch.tensor([1, 1, 2]), 10)
    with pytest.raises(ValueError, match="non-empty list"):
        check_token_map(torch.tensor([], dtype=torch.int64), 10)


def test_the_shipped_qwen_map_keeps_its_special_tokens():
    ids = torch.load(shipped_map_path("qwen2.5"), weights_only=True)
    assert len(ids) == 49152 and ids == sorted(set(ids))
    assert {151643, 151645} <= set(ids)  # <|endoftext|>, <|im_end|>: answers end in a draft
    with pytest.raises(ValueError, match="no shipped token map 'llama'"):
        shipped_map_path("llama")


def test_a_cut_head_scores_its_rows_and_leaves_a_tied_embedding_whole():
    embed = torch.nn.Embedding(10, 4)  # a tied model embeds with its LM head's module
    embed.quant_method = object()  # SGLang's layers carry one; the cut head gets its own
    hot = torch.tensor([1, 4, 7])
    head = hot_vocab_head(embed, hot)
    assert head.quant_method is not embed.quant_method and type(head.quant_method) is object
    assert embed.weight.shape == (10, 4) and head.weight.shape == (3, 4)
    assert torch.equal(head.weight, embed.weight[hot])  # its rows, bit for bit
    # Its scores are the full head's columns up to rounding: GEMMs of other shapes may add in
    # other orders (the kernel is chosen by shape and by machine), so not bit for bit.
    x = torch.randn(2, 4)
    torch.testing.assert_close(x @ head.weight.T, (x @ embed.weight.T)[:, hot])
    assert torch.equal(embed(torch.tensor([9])), embed.weight[9:10])  # the embedding still has every row
    assert head.weight.data_ptr() != embed.weight.data_ptr()
