"""Truncated draft models: the first K layers of a checkpoint, loadable, equal where kept."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from sglang_specsot.models.tiny import build_tiny_model
from sglang_specsot.models.truncate import truncate_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")  # 4 layers


def test_keeps_the_first_layers_and_everything_else(tiny, tmp_path):
    out = truncate_model(tiny, tmp_path / "draft", num_layers=2)
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2
    full, cut = load_file(tiny / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(cut) == {k for k in full if not k.startswith(("model.layers.2.", "model.layers.3."))}
    assert all(torch.equal(cut[k], full[k]) for k in cut)
    assert (out / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()


def test_truncated_model_equals_the_target_run_with_its_first_layers(tiny, tmp_path):
    out = truncate_model(tiny, tmp_path / "draft", num_layers=1)
    target = AutoModelForCausalLM.from_pretrained(tiny, torch_dtype=torch.float32)
    draft = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
    ids = torch.tensor([[5, 9, 13, 2, 7]])
    target.model.layers = target.model.layers[:1]
    target.config.num_hidden_layers = 1
    with torch.no_grad():
        assert torch.allclose(draft(ids).logits, target(ids).logits, atol=1e-5)


@pytest.mark.parametrize("layers", [0, 4, 9])
def test_impossible_layer_counts_name_the_range(tiny, tmp_path, layers):
    with pytest.raises(ValueError, match=r"--layers must be 1\.\.3"):
        truncate_model(tiny, tmp_path / "draft", num_layers=layers)


def test_refuses_to_overwrite(tiny, tmp_path):
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "x").write_text("keep me")
    with pytest.raises(ValueError, match="not empty"):
        truncate_model(tiny, tmp_path / "draft", num_layers=1)
    assert (tmp_path / "draft" / "x").read_text() == "keep me"


def test_cli_prints_the_directory(tiny, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "sglang_specsot.models", "truncate", str(tiny), "--layers", "3", "--out", str(tmp_path / "d")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    assert out.stdout.strip() == str(tmp_path / "d")
    bad = subprocess.run(
        [sys.executable, "-m", "sglang_specsot.models", "truncate", "smollm2-135m-nope", "--layers", "3", "--out", str(tmp_path / "e")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 1 and "error:" in bad.stderr
