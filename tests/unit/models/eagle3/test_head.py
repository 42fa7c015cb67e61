"""The head's training-time unroll against drafting as a server does it, token by token."""

import math

import pytest
import torch
from torch.nn import functional as F

from sglang_specsot.models.eagle3.head import Eagle3Head, HeadShape, rope

CONFIG = {"num_hidden_layers": 8, "vocab_size": 50, "hidden_size": 16, "intermediate_size": 24,
          "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 10000.0}  # fmt: skip


def make_head(seed=0, draft_vocab=20) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(HeadShape.from_target(CONFIG, draft_vocab))
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    head.set_vocab(torch.arange(0, 2 * draft_vocab, 2))
    return head


def reference_chain(head: Eagle3Head, aux, embed, tokens, base: int, steps: int) -> list[torch.Tensor]:
    """Drafting from `base` as a server does: draft-extend writes the head's KV for positions
    0..base; each draft step is one new query at the next position, attending to every key
    written before it and its own (plain causal attention over a growing cache)."""
    s, attn = head.shape, head.midlayer.self_attn
    groups = s.num_heads // s.num_kv_heads

    def qkv(x, pos):
        def heads(t, n):
            return t.view(1, -1, n, s.head_dim).transpose(1, 2)
        p = torch.tensor([[pos]])
        q = rope(heads(attn.q_proj(x), s.num_heads), p, s.rope_theta)
        k = rope(heads(attn.k_proj(x), s.num_kv_heads), p, s.rope_theta)
        return q, k.repeat_interleave(groups, 1), heads(attn.v_proj(x), s.num_kv_heads).repeat_interleave(groups, 1)

    def layer_in(tok, hidden):
        m = head.midlayer
        return torch.cat([m.input_layernorm(embed(tok)), m.hidden_norm(hidden)], -1)

    def finish(hidden, q, keys, values):
        probs = torch.softmax(q @ torch.cat(keys, 2).transpose(-1, -2) / math.sqrt(s.head_dim), -1)
        out = (probs @ torch.cat(values, 2)).transpose(1, 2).reshape(1, 1, -1)
        h = hidden + attn.o_proj(out)
        h = h + head.midlayer.mlp(head.midlayer.post_attention_layernorm(h))
        return head.lm_head(head.norm(h)), h

    keys, values, out = [], [], []
    for i in range(base + 1):  # draft-extend over the accepted text
        hidden = head.fc(aux[:, i : i + 1])
        q, k, v = qkv(layer_in(tokens[:, i + 1 : i + 2], hidden), i)
        keys.append(k), values.append(v)
        logits, h = finish(hidden, q, keys, values)
    out.append(logits)
    for k_step in range(1, steps):  # each later step reads the token its predecessor stands for
        q, k, v = qkv(layer_in(tokens[:, base + k_step + 1 : base + k_step + 2], h), base + k_step)
        keys.append(k), values.append(v)
        logits, h = finish(h, q, keys, values)
        out.append(logits)
    return out


@pytest.mark.parametrize("base", [0, 3, 6])
def test_unroll_is_drafting_token_by_token(base):
    head = make_head()
    t, steps = 9, 4
    aux = torch.randn(1, t, 3 * 16)
    tokens = torch.randint(0, 50, (1, t + steps))
    table = torch.randn(50, 16)
    embed = lambda ids: table[ids]  # noqa: E731
    with torch.no_grad():
        unrolled = head.unroll(aux, embed, tokens[:, 1 : t + steps], steps)
        chain = reference_chain(head, aux, embed, tokens, base, steps)
    for k in range(steps):
        torch.testing.assert_close(unrolled[k][0, base], chain[k][0, 0], rtol=1e-4, atol=1e-4)


def test_a_step_never_reads_tokens_after_the_one_it_stands_for():
    head = make_head()
    t, steps = 8, 3
    aux = torch.randn(1, t, 48)
    tokens = torch.randint(0, 50, (1, t + steps - 1))
    table = torch.randn(50, 16)
    with torch.no_grad():
        before = head.unroll(aux, lambda ids: table[ids], tokens, steps)
        later = tokens.clone()
        later[:, 6:] = (later[:, 6:] + 1) % 50  # step k at base i reads column i + k; change columns >= 6
        after = head.unroll(aux, lambda ids: table[ids], later, steps)
    for k in range(steps):
        unchanged = 6 - k  # bases whose columns i + k' (k' <= k) all stay below 6
        torch.testing.assert_close(before[k][0, :unchanged], after[k][0, :unchanged])
        assert not torch.allclose(before[k][0, unchanged:], after[k][0, unchanged:])


def test_shape_from_a_target_and_its_limits():
    s = HeadShape.from_target(CONFIG, 20)
    assert s.aux_layer_ids == (1, 3, 4) and s.head_dim == 4 and s.num_kv_heads == 2
    config = s.sglang_config()
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 20
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}
    with pytest.raises(ValueError, match="draft_vocab_size=51"):
        HeadShape.from_target(CONFIG, 51)
    with pytest.raises(ValueError, match="at least 5"):
        HeadShape.from_target({**CONFIG, "num_hidden_layers": 4}, 20)


def test_vocab_maps_as_sglang_reads_them():
    head = make_head(draft_vocab=5)
    head.set_vocab(torch.tensor([1, 4, 9, 10, 30]))
    # SGLang: hot_token_id = d2t + arange (llama_eagle3.load_weights)
    assert (head.d2t + torch.arange(5)).tolist() == [1, 4, 9, 10, 30]
    assert head.t2d.nonzero().flatten().tolist() == [1, 4, 9, 10, 30]
    with pytest.raises(ValueError, match="ascending"):
        head.set_vocab(torch.tensor([4, 1, 9, 10, 30]))


def test_rope_is_rotate_half():
    x = torch.randn(1, 2, 3, 8)
    pos = torch.tensor([[0, 1, 5]])
    out = rope(x, pos, 10000.0)
    torch.testing.assert_close(out[:, :, 0], x[:, :, 0])  # position 0 is unrotated
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps length
    inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2).float() / 8))
    a = 5 * inv
    first = x[0, 0, 2, :4] * torch.cos(a) - x[0, 0, 2, 4:] * torch.sin(a)
    torch.testing.assert_close(out[0, 0, 2, :4], first)
    assert F is not None
