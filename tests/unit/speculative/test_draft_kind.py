"""What --speculative-draft-model-path names (speculative/draft_kind.py)."""

from __future__ import annotations

import json

import pytest

from sglang_specsot.speculative.draft_kind import DraftKind, draft_kind, head_mismatch, kind_of_architectures


@pytest.mark.parametrize(
    ("architectures", "kind"),
    [
        (["LlamaForCausalLMEagle3"], DraftKind.EAGLE3),
        (["Eagle3DeepseekV2ForCausalLM"], DraftKind.EAGLE3),
        (["LlamaForCausalLMEagle"], DraftKind.EAGLE),
        (["Qwen2ForCausalLMEagle"], DraftKind.EAGLE),
        (["Qwen2ForCausalLM"], DraftKind.MODEL),
        ([], DraftKind.MODEL),
    ],
)
def test_the_kind_is_read_from_the_architectures(architectures, kind):
    assert kind_of_architectures(architectures) is kind
    assert kind.is_head == (kind is not DraftKind.MODEL)


def test_a_path_without_config_is_a_draft_model(tmp_path):
    assert draft_kind(str(tmp_path / "model.gguf")) is DraftKind.MODEL
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    assert draft_kind(str(tmp_path / "head")) is DraftKind.EAGLE3


def test_a_multimodal_targets_sizes_are_read_from_its_text_config():
    target = {"text_config": {"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 4}}
    head = {"vocab_size": 10, "hidden_size": 8, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}
    assert head_mismatch(target, head, DraftKind.EAGLE3) is None
    # Layer 3 is the last: its output is the final hidden state, which SGLang captures as no layer's input.
    head["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 1, 3]
    assert "not all within 0..2" in head_mismatch(target, head, DraftKind.EAGLE3)
    # An EAGLE(-2) head reads the last hidden state only: aux ids are not its.
    assert head_mismatch(target, head, DraftKind.EAGLE) is None
