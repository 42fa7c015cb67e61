"""The pure parts of the GGUF converter: tokenizer fixes, tensor checks, safetensors sharding."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from sglang_specsot.models.convert import (
    CONTROL,
    UNUSED,
    USER_DEFINED,
    GgufMeta,
    check_tensors,
    finish_config_json,
    fix_tokenizer_json,
    write_safetensors,
)

NORMAL = 1


def _meta(pre: str, token_types: list[int]) -> GgufMeta:
    return GgufMeta(architecture="llama", pre=pre, token_types=tuple(token_types), chat_template="{{ x }}",
                    special_ids={"eos": 0}, context_length=128)


def _tokenizer_doc() -> dict:
    """A byte-level BPE document shaped like transformers' GGUF rebuild: no digit split, no NFC."""
    from tokenizers import models, pre_tokenizers

    vocab = {"<|end|>": 0, "<tool>": 1, "1": 2, "2": 3, "Ġ": 4, "a": 5, "Ã": 6, "©": 7, "12": 8,
             "[PAD9]": 9, "[PAD10]": 10}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("1", "2")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_special_tokens(["<|end|>", "<tool>"])
    return json.loads(tok.to_str())


TYPES = [CONTROL, USER_DEFINED, NORMAL, NORMAL, NORMAL, NORMAL, NORMAL, NORMAL, NORMAL, UNUSED, UNUSED]


def test_smollm_gets_digits_split_before_byte_level():
    assert Tokenizer.from_str(json.dumps(_tokenizer_doc())).encode(" 12").ids == [4, 8]  # before: "12" merged
    doc = fix_tokenizer_json(_tokenizer_doc(), _meta("smollm", TYPES))
    steps = doc["pre_tokenizer"]["pretokenizers"]
    assert steps[0] == {"type": "Digits", "individual_digits": True}
    assert steps[1]["type"] == "ByteLevel" and steps[1]["use_regex"] is True
    assert doc["normalizer"] is None
    # " 12" is one ByteLevel word; with the digit split it is " ", "1", "2".
    assert Tokenizer.from_str(json.dumps(doc)).encode(" 12").ids == [4, 2, 3]


def test_qwen_gets_the_nfc_normalizer():
    doc = fix_tokenizer_json(_tokenizer_doc(), _meta("qwen2", TYPES))
    assert doc["normalizer"] == {"type": "NFC"}
    tok = Tokenizer.from_str(json.dumps(doc))
    assert tok.encode("e\u0301").ids == tok.encode("\u00e9").ids  # decomposed é == composed é


def test_padding_entries_are_dropped_and_special_follows_the_token_type():
    doc = fix_tokenizer_json(_tokenizer_doc(), _meta("qwen2", TYPES))
    assert "[PAD9]" not in doc["model"]["vocab"] and "[PAD10]" not in doc["model"]["vocab"]
    assert max(doc["model"]["vocab"].values()) == 8
    assert {t["content"]: t["special"] for t in doc["added_tokens"]} == {"<|end|>": True, "<tool>": False}


def test_unknown_pre_tokenizer_is_refused():
    with pytest.raises(ValueError, match="'llama-bpe'"):
        fix_tokenizer_json(_tokenizer_doc(), _meta("llama-bpe", TYPES))


def test_check_tensors_accepts_dense_bf16_and_names_what_is_wrong():
    expected = {"a.weight": (4, 8), "b.weight": (8,)}
    good = {"a.weight": torch.zeros(4, 8, dtype=torch.bfloat16), "b.weight": torch.ones(8, dtype=torch.bfloat16)}
    check_tensors(good, expected)
    with pytest.raises(ValueError, match=r"missing \['b.weight'\]"):
        check_tensors({"a.weight": good["a.weight"]}, expected)
    with pytest.raises(ValueError, match="still quantized"):  # packed blocks: bytes, another shape
        check_tensors({**good, "a.weight": torch.zeros(4, 18, dtype=torch.uint8)}, expected)


def _tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(64, 64, generator=gen).to(torch.bfloat16) for i in range(5)}


def test_single_file_when_it_fits(tmp_path):
    tensors = _tensors()
    expected = {k: v.clone() for k, v in tensors.items()}
    write_safetensors(tensors, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    loaded = load_file(tmp_path / "model.safetensors")
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], v) for k, v in expected.items())
    assert tensors == {}  # freed as written


def test_shards_and_index_when_it_does_not(tmp_path):
    expected = _tensors()
    write_safetensors({k: v.clone() for k, v in expected.items()}, tmp_path, max_shard_bytes=2 * 64 * 64 * 2)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert index["metadata"]["total_size"] == 5 * 64 * 64 * 2
    for name, tensor in expected.items():
        assert torch.equal(load_file(tmp_path / index["weight_map"][name])[name], tensor)


def test_config_gets_top_level_rope_theta_and_loses_quantization(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"},
        "quantization_config": {"quant_method": "gguf"}, "_name_or_path": "x", "_model_name_or_path": "y",
    }))
    finish_config_json(tmp_path, 1e6)
    assert json.loads((tmp_path / "config.json").read_text()) == {
        "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}, "rope_theta": 1e6,
    }
