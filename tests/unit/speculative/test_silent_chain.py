"""Launches that would verify every SPECSOT tree as a chain, silently, are refused before any
weight loads: resolved by SGLang's own argument resolution (`ServerArgs.resolve_once`, as the
launcher runs it) on this CPU, with the GPU's facts faked through SGLang's `override_platform`,
and the model facts read by SGLang's own rules (`use_mla_backend`, `mambaish_config`, the
split-KV condition of `TritonAttnBackend.__init__`).
"""

from __future__ import annotations

import json
import os

import pytest
from sglang.srt.runtime_context import override_platform
from sglang.srt.server_args import ServerArgs

from sglang_specsot.host import adapter as sgl
from sglang_specsot.speculative.registration import register_specsot

HOPPER = dict(
    is_cuda=True,
    is_sm90=True,
    is_hopper_with_cuda_12_3=True,
    device_capability=(9, 0),
    device_sm=90,
)
MI355 = dict(is_cuda=False, is_hip=True, device_capability=(9, 5), device_sm=95)
COMMON = {
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "intermediate_size": 352,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1024, **COMMON,
}  # fmt: skip
# An MLA model: SGLang attends with its MLA backends (use_mla_backend).
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 128,
    "intermediate_size": 256, "moe_intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 2, "vocab_size": 1024, "kv_lora_rank": 64, "q_lora_rank": None, "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, **COMMON,
}  # fmt: skip
# A hybrid linear-attention model: SGLang wraps its attention in HybridLinearAttnBackend.
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 128,
    "intermediate_size": 256, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 4,
    "full_attention_interval": 4, "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 1024,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4, **COMMON,
}  # fmt: skip


@pytest.fixture
def launch(tmp_path):
    """Resolve a launch of a checkpoint with `config` as SGLang's launcher does; resolution
    sets SGLang's environment variables, put back after."""
    register_specsot()
    saved = dict(os.environ)

    def run(config: dict, platform: dict, **flags) -> ServerArgs:
        (tmp_path / "config.json").write_text(json.dumps(config))
        with override_platform(**platform):
            sa = ServerArgs(model_path=str(tmp_path), device="cuda", **flags)
            sa.resolve_once()
        return sa

    yield run
    os.environ.clear()
    os.environ.update(saved)


def test_silent_chain_flashinfer_on_mla_is_refused_naming_flag_and_fix(launch):
    with pytest.raises(ValueError) as err:
        launch(
            DEEPSEEK_V3,
            HOPPER | {"has_flashinfer": True},
            speculative_algorithm="SPECSOT",
            attention_backend="flashinfer",
        )
    message = str(err.value)
    assert (
        "--attention-backend flashinfer" in message
        and "MLA" in message
        and "DeepseekV3ForCausalLM" in message
    )
    assert "--attention-backend triton" in message


def test_silent_chain_mla_without_flashinfer_launches(launch):
    # The backend SPECSOT chooses itself for MLA is Triton, which reads the tree mask.
    launch(
        DEEPSEEK_V3, HOPPER | {"has_flashinfer": True}, speculative_algorithm="SPECSOT"
    )


def test_silent_chain_hybrid_linear_attention_is_refused_naming_flag_and_fix(launch):
    with pytest.raises(ValueError) as err:
        launch(QWEN3_NEXT, HOPPER, speculative_algorithm="SPECSOT")
    message = str(err.value)
    assert (
        "--speculative-algorithm SPECSOT" in message
        and "Qwen3NextForCausalLM" in message
    )
    assert (
        "Qwen3NextConfig" in message
        and "Drop --speculative-algorithm SPECSOT" in message
    )


def test_silent_chain_hybrid_linear_attention_is_refused_on_a_cpu_too(tmp_path):
    register_specsot()
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_NEXT))
    saved = dict(os.environ)
    try:
        with pytest.raises(ValueError, match="Qwen3NextForCausalLM .*Drop --speculative-algorithm SPECSOT"):
            ServerArgs(model_path=str(tmp_path), device="cpu", speculative_algorithm="SPECSOT").resolve_once()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_silent_chain_hybrid_model_facts_come_from_sglangs_rule():
    from sglang.srt.configs.model_config import ModelConfig

    assert (
        sgl.linear_attention_config_name(_model_config(QWEN3_NEXT)) == "Qwen3NextConfig"
    )
    assert sgl.linear_attention_config_name(_model_config(LLAMA)) is None
    assert isinstance(_model_config(LLAMA), ModelConfig)


def _model_config(config: dict, _dirs: list = []):  # noqa: B006 - keeps the temp dirs alive
    import tempfile

    from sglang.srt.configs.model_config import ModelConfig

    path = tempfile.mkdtemp(prefix="silent-chain-")
    _dirs.append(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return ModelConfig(path)


@pytest.mark.parametrize(("env", "refused"), [(None, True), ("1", True), ("0", False)])
def test_silent_chain_rocm_splitkv_verify_is_refused_naming_env_and_fix(
    launch, monkeypatch, env, refused
):
    from sglang.srt import utils

    monkeypatch.setattr(utils, "is_gfx95_supported", lambda: True)
    if env is None:
        monkeypatch.delenv(
            "SGLANG_ENABLE_SPLITKV_VERIFY", raising=False
        )  # SGLang's default is on
    else:
        monkeypatch.setenv("SGLANG_ENABLE_SPLITKV_VERIFY", env)
    if not refused:
        launch(
            LLAMA, MI355, speculative_algorithm="SPECSOT", attention_backend="triton"
        )
        return
    with pytest.raises(ValueError) as err:
        launch(
            LLAMA, MI355, speculative_algorithm="SPECSOT", attention_backend="triton"
        )
    assert "SGLANG_ENABLE_SPLITKV_VERIFY=1" in str(
        err.value
    ) and "Set SGLANG_ENABLE_SPLITKV_VERIFY=0" in str(err.value)


def test_silent_chain_splitkv_is_off_beside_rocm_gfx95(monkeypatch):
    from sglang.srt import utils

    monkeypatch.setattr(utils, "is_gfx95_supported", lambda: False)
    with override_platform(is_hip=True):
        assert not sgl.splitkv_verify_on()
    monkeypatch.setattr(utils, "is_gfx95_supported", lambda: True)
    with override_platform(is_hip=False):
        assert not sgl.splitkv_verify_on()


def test_silent_chain_other_algorithms_and_plain_launches_are_left_alone():
    from sglang_specsot.speculative.backend_choice import (
        ModelFacts,
        silent_chain_refusal,
        tree_backend_declaration,
    )

    chosen = {
        "attention_backend": "flashinfer",
        "prefill_attention_backend": None,
        "decode_attention_backend": None,
    }
    every = ModelFacts(
        mla=True,
        architecture="X",
        linear_attention="Qwen3NextConfig",
        splitkv_verify=True,
    )
    assert silent_chain_refusal("cuda", "EAGLE", chosen, every) is None
    assert silent_chain_refusal("cuda", "SPECSOT", chosen, ModelFacts()) is None
    assert (
        tree_backend_declaration(
            "cpu", "SPECSOT", chosen, "triton", ModelFacts(mla=True)
        )
        == {}
    )
    with pytest.raises(
        ValueError, match="linear-attention"
    ):  # a CPU too: the state follows a chain there
        tree_backend_declaration("cpu", "SPECSOT", chosen, "triton", every)


def test_silent_chain_a_backend_without_a_tree_is_refused_first():
    # Its fix (another backend) comes before the split-KV environment's.
    from sglang_specsot.speculative.backend_choice import ModelFacts, tree_backend_declaration

    fa3 = {"attention_backend": "fa3", "prefill_attention_backend": None, "decode_attention_backend": None}
    with pytest.raises(ValueError, match="--attention-backend fa3 does not"):
        tree_backend_declaration("cuda", "SPECSOT", fa3, "triton", ModelFacts(splitkv_verify=True))
