"""SGLang's FutureMap, able to relay a draft model's top-k on a CPU.

`FutureMap._resolve_spec_extras` (overlap_utils.py:476-534; the adapter's `resolve_spec_extras`)
gathers the relayed top-k, bonus tokens and hidden states of the next step with the fused
Triton kernel `gather_spec_extras`, which cannot run on a CPU. `create_future_map` is SGLang's
extension point for exactly this (PR #24999), so on CPU the same rows are gathered with plain
tensor indexing; on other devices SGLang's own path runs unchanged.
"""

from __future__ import annotations

from sglang_specsot.host import adapter as sgl


class SoTFutureMap(sgl.FutureMapBase):
    def resolve_spec_extras(self, batch) -> None:
        if not (self.need_topk and str(self.device).startswith("cpu")):
            super().resolve_spec_extras(batch)
            return
        draft_input = batch.spec_info
        if draft_input is None or draft_input.future_indices is None:
            return  # prefill carries no draft input yet
        indices = draft_input.future_indices
        if indices.shape[0] == 0:
            return
        draft_input.topk_p = self.topk_p_buf[indices]
        draft_input.topk_index = self.topk_index_buf[indices]
        draft_input.bonus_tokens = self.output_tokens_buf[indices]
        if self.need_hidden_states:
            draft_input.hidden_states = self.hidden_states_buf[indices]
        if self.draft_probs_buf is not None:
            draft_input.draft_probs = self.draft_probs_buf[indices]
        draft_input.dsa_topk_indices = None  # no DSA indexer on this path
