"""The tiny random-weight Llama: loadable by transformers and SGLang, deterministic, CLI output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sglang_specsot.models.tiny import SPECIAL_TOKENS, TinySpec, build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_checkpoint_files(tiny):
    names = {p.name for p in tiny.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja"} <= names
    config = json.loads((tiny / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["rope_theta"] == 10000.0
    assert "quantization_config" not in config
    weights = load_file(tiny / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert 0.8e6 < sum(t.numel() for t in weights.values()) < 1.3e6  # "about 1M parameters"


def test_transformers_loads_it_and_generates(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    assert len(tokenizer) == TinySpec().vocab_size == model.config.vocab_size
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Give me 3 tips."}],
                                           add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\nGive me 3 tips.<|im_end|>\n<|im_start|>assistant\n"
    inputs = tokenizer(prompt, return_tensors="pt")
    assert set(inputs) == {"input_ids", "attention_mask"}
    out = model.generate(**inputs, max_new_tokens=6, do_sample=False, min_new_tokens=6)
    new = out[0, inputs["input_ids"].shape[1]:].tolist()
    assert len(new) == 6 and all(0 <= t < len(tokenizer) for t in new)
    assert len(set(new)) > 1  # untied random weights do not just echo one token


def test_tokenizer_splits_digits_and_keeps_specials_whole(tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    assert tokenizer.tokenize("2025") == ["2", "0", "2", "5"]
    ids = tokenizer("<|im_start|>hi<|im_end|>")["input_ids"]
    assert ids[0] == tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[1])
    assert ids[-1] == tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[2]) == tokenizer.eos_token_id
    text = "Drink water, walk 30 minutes; def f(x): return x"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_sglang_model_config_reads_it(tiny):
    from sglang.srt.configs.model_config import ModelConfig

    config = ModelConfig(str(tiny))
    assert config.hf_config.architectures == ["LlamaForCausalLM"]
    assert config.dtype == torch.bfloat16
    assert config.context_len == 4096
    assert config.vocab_size == TinySpec().vocab_size
    assert config.num_hidden_layers == TinySpec().num_layers
    assert config.hf_eos_token_id == {2}


def test_same_seed_same_bytes_other_seed_other_weights(tiny, tmp_path):
    again = build_tiny_model(tmp_path / "again")
    for name in ("tokenizer.json", "model.safetensors", "config.json"):
        assert (again / name).read_bytes() == (tiny / name).read_bytes(), name
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert (other / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (tiny / "model.safetensors").read_bytes()


def test_shape_options(tmp_path):
    path = build_tiny_model(tmp_path / "small", vocab_size=512, hidden_size=64, num_layers=2)
    config = json.loads((path / "config.json").read_text())
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]) == (512, 64, 2)
    assert len(json.loads((path / "tokenizer.json").read_text())["model"]["vocab"]) == 512


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="must divide"):
        TinySpec(hidden_size=100, num_heads=3)
    with pytest.raises(ValueError, match="too small"):
        TinySpec(vocab_size=100)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        build_tiny_model(tmp_path / "busy")


def test_cli_prints_only_the_directory(tmp_path):
    out = tmp_path / "cli"
    result = subprocess.run(
        [sys.executable, "-m", "sglang_specsot.models", "tiny", "--out", str(out), "--layers", "1", "--seed", "3"],
        capture_output=True, text=True, env=dict(os.environ), timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{out}\n"
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1
    again = subprocess.run([sys.executable, "-m", "sglang_specsot.models", "tiny", "--out", str(out)],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and again.stdout == "" and "not empty" in again.stderr
    assert "Traceback" not in again.stderr
