"""What verify commits when no request has a draft: each request's root, one token.

A step whose trees are all a root alone (width 1) is a plain decode step in verify's shape.
Two parts of SGLang's tree commit then have a known result and only cost host time every
step, which a plain decode step does not pay (measured in docs/benchmarks.md):

- `move_accept_tokens_to_target_kvcache` copies the accepted path's KV to the request's next
  slots; the root *is* in its request's next slot (verify writes row 0 at `seq_lens`), so the
  copy is of every layer's row onto itself. It is skipped at width 1 for every batch.
- `eagle_sample`'s greedy branch walks each tree for the longest path matching the target's
  argmax; a root alone commits its argmax. That holds only where eagle_sample would take the
  greedy branch on untransformed logits: every request greedy, no penalties, logit bias,
  grammar, watermark or simulated acceptance (`commits_argmax`). Any other batch samples
  through eagle_sample, which stays the single definition of what verify commits.

The result has eagle_sample's shapes and dtypes, so logprobs, the mamba commit and the
drafters read it unchanged.
"""

from __future__ import annotations

import torch

from sglang_specsot.host import adapter as sgl


def commits_argmax(sampling_info, grammar_mask, watermark_state) -> bool:
    """Whether eagle_sample would commit each root's argmax of the logits as they are."""
    if not sampling_info.is_all_greedy or grammar_mask is not None or sgl.simulated_accept_len() > 0:
        return False
    if sampling_info.logit_bias is not None:
        return False
    if sampling_info.acc_additive_penalties is not None or sampling_info.acc_scaling_penalties is not None:
        return False
    return watermark_state is None or not sampling_info.has_watermark_candidates


def root_argmax(next_token_logits: torch.Tensor, bs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(predict, accept_lens, accept_index) as eagle_sample returns them for width-1 trees.

    shapes: next_token_logits (bs, vocab); predict (bs,) int32; accept_lens (bs,) int32, all 1;
    accept_index (bs, 1) int32, request b's row b."""
    sgl.sanitize_nan_logits(next_token_logits, "verify: target model logits")
    predict = torch.argmax(next_token_logits, dim=-1).to(torch.int32)
    device = next_token_logits.device
    accept_lens = torch.ones(bs, dtype=torch.int32, device=device)
    accept_index = torch.arange(bs, dtype=torch.int32, device=device).view(bs, 1)
    return predict, accept_lens, accept_index
