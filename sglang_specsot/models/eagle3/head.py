"""An EAGLE-3 draft head in plain torch, with the parameter names SGLang's
`LlamaForCausalLMEagle3` loads (srt/models/llama_eagle3.py), so a trained head is served as is.

The head computes what SGLang's does at one draft step:
- `fc` maps the target's three captured hidden states (concatenated, `3 * hidden`) to `hidden`;
  at later steps the input is the head's own pre-norm output, which needs no `fc` (SGLang
  applies `fc` only when the width is not `hidden`).
- One decoder layer whose attention reads `cat(input_layernorm(embed(token)), hidden_norm(h))`
  (width `2 * hidden`), with `h` as the residual; then the usual MLP block.
- Logits come from `lm_head(norm(out))` over the draft vocabulary; the next step's hidden is
  `out` before the norm (SGLang's `hidden_states_to_aux` when `norm_output` is off).

`unroll` is EAGLE-3's training-time test: `steps` draft steps over a whole sequence at once.
Step k at position i stands for the k-th draft after base position i: its query sits at
position i + k and attends to step 0's keys at positions <= i (the head's KV cache of the
accepted text) and to its own earlier steps' keys at position i (the chain drafted so far).
That is SpecForge's cache layout (specforge/modeling/draft/llama3_eagle.py, sdpa path);
`tests/unit/models/eagle3/test_head.py` checks it against step-by-step drafting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

ARCHITECTURE = "LlamaForCausalLMEagle3"


@dataclass(frozen=True)
class HeadShape:
    """The sizes a head takes from its target, and its own draft vocabulary."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    draft_vocab_size: int
    aux_layer_ids: tuple[int, ...]
    max_position_embeddings: int

    @classmethod
    def from_target(cls, config: dict, draft_vocab_size: int) -> HeadShape:
        """The head for a target's `config.json`, reading layers early, middle and late
        (1, L/2 - 1, L - 4: SGLang's default capture for EAGLE-3 targets)."""
        layers = int(config["num_hidden_layers"])
        if layers < 5:
            raise ValueError(f"the target has {layers} decoder layers; an EAGLE-3 head reads three distinct "
                             "layers below the last four, so it needs at least 5")
        vocab = int(config["vocab_size"])
        if not 0 < draft_vocab_size <= vocab:
            raise ValueError(f"draft_vocab_size={draft_vocab_size} must be within 1..{vocab} (the target's vocabulary)")
        heads = int(config["num_attention_heads"])
        rope = config.get("rope_parameters") or {}
        return cls(
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            vocab_size=vocab,
            draft_vocab_size=draft_vocab_size,
            aux_layer_ids=(1, layers // 2 - 1, layers - 4),
            max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
        )

    def sglang_config(self) -> dict:
        """`config.json` as SGLang reads an EAGLE-3 head (SpecForge's layout)."""
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)},
        }


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 and cast back, as SGLang's."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding, rotate-half (neox) style as SGLang's Llama: x [B, heads, T, D]."""
    dim = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = positions.float()[:, None, :, None] * inv  # [B, 1, T, D/2]
    cos, sin = torch.cos(angles), torch.sin(angles)
    x1, x2 = x[..., : dim // 2].float(), x[..., dim // 2 :].float()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, s: HeadShape) -> None:
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(2 * s.hidden_size, s.num_heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * s.hidden_size, s.num_kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * s.hidden_size, s.num_kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.num_heads * s.head_dim, s.hidden_size, bias=False)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.s.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: list) -> torch.Tensor:
        """`cache` holds each earlier step's (keys, values); this step's are appended.
        Step 0 attends causally; step k adds its earlier steps' keys at the same position."""
        s = self.s
        q = rope(self._heads(self.q_proj(x), s.num_heads), positions, s.rope_theta)
        k = rope(self._heads(self.k_proj(x), s.num_kv_heads), positions, s.rope_theta)
        v = self._heads(self.v_proj(x), s.num_kv_heads)
        groups = s.num_heads // s.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        cache.append((k, v))
        k0, v0 = cache[0]
        t = x.shape[1]
        scores = q @ k0.transpose(-1, -2) / math.sqrt(s.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        diag = [(q * kj).sum(-1, keepdim=True) / math.sqrt(s.head_dim) for kj, _ in cache[1:]]
        probs = torch.softmax(torch.cat([scores, *diag], dim=-1).float(), dim=-1).to(q.dtype)
        out = probs[..., :t] @ v0
        for j, (_, vj) in enumerate(cache[1:]):
            out = out + probs[..., t + j : t + j + 1] * vj
        b = x.shape[0]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, s.num_heads * s.head_dim))


class MLP(nn.Module):
    def __init__(self, s: HeadShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """SGLang's EAGLE-3 input layer (llama_eagle3.LlamaDecoderLayer with layer_id 0)."""

    def __init__(self, s: HeadShape) -> None:
        super().__init__()
        self.hidden_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = MLP(s)

    def forward(self, embeds, hidden, positions, cache) -> torch.Tensor:
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        hidden = hidden + self.self_attn(x, positions, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(nn.Module):
    """The head's trainable part; the token embedding stays the target's (SGLang shares it)."""

    def __init__(self, s: HeadShape) -> None:
        super().__init__()
        self.shape = s
        self.fc = nn.Linear(len(s.aux_layer_ids) * s.hidden_size, s.hidden_size, bias=False)
        self.midlayer = MidLayer(s)
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.lm_head = nn.Linear(s.hidden_size, s.draft_vocab_size, bias=False)
        # d2t[d] + d is draft row d's target id; t2d marks the target ids the head can propose.
        self.register_buffer("d2t", torch.zeros(s.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(s.vocab_size, dtype=torch.bool))

    def set_vocab(self, target_ids: torch.Tensor) -> None:
        """Draft row d proposes target id `target_ids[d]` (ascending, distinct)."""
        ids = target_ids.long()
        if ids.numel() != self.shape.draft_vocab_size or not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("the draft vocabulary must be draft_vocab_size distinct target ids, ascending")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    def target_ids(self) -> torch.Tensor:
        return self.d2t + torch.arange(self.d2t.numel())

    def step(self, embeds, hidden, positions, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step: (draft-vocabulary logits, the next step's hidden)."""
        if hidden.shape[-1] != self.shape.hidden_size:
            hidden = self.fc(hidden)
        out = self.midlayer(embeds, hidden, positions, cache)
        return self.lm_head(self.norm(out)), out

    def unroll(self, aux: torch.Tensor, embed, input_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test over a batch: `aux` [B, T, 3H] the target's captured states at
        positions 0..T-1, `input_ids` [B, T + steps - 1] where column i + k is the token step k
        reads at base position i (the text shifted by one, then by k). Returns one [B, T, V_draft]
        logits tensor per step."""
        b, t, _ = aux.shape
        if input_ids.shape[1] < t + steps - 1:
            raise ValueError(f"input_ids has {input_ids.shape[1]} columns; {steps} steps over {t} positions need {t + steps - 1}")
        base = torch.arange(t).expand(b, t)
        hidden, cache, logits = aux, [], []
        for k in range(steps):
            out, hidden = self.step(embed(input_ids[:, k : k + t]), hidden, base + k, cache)
            logits.append(out)
        return logits
