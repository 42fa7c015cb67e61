"""A random-weight Qwen2 for the device check's stages (no download): its shape, the small
one the CPU smoke runs, and the device the stages run on."""

from __future__ import annotations

from dataclasses import dataclass


def stage_device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class Qwen2Shape:
    """A Qwen2 architecture; the defaults are Qwen2.5-1.5B's."""

    hidden: int = 1536
    layers: int = 28
    heads: int = 12
    kv_heads: int = 2
    intermediate: int = 8960
    vocab: int = 151936
    init_std: float = 0.02


# std 0.2: at 0.02 this small model answers every prompt with one token repeated, and a draft
# that read the wrong row or slot would still propose that token.
SMOKE_MODEL = Qwen2Shape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512, init_std=0.2)


def random_qwen2(shape: Qwen2Shape, dtype, device, seed: int = 0):
    """transformers' Qwen2ForCausalLM with random weights, built on `device` (no download)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, initializer_range=shape.init_std,
        attn_implementation="sdpa", architectures=["Qwen2ForCausalLM"], bos_token_id=0, eos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in `dtype` directly: no float32 copy of 1.5B weights
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()
