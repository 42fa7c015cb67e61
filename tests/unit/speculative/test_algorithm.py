"""SPECSOT's registration and server-argument defaults and validation."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig

from sglang_specsot.speculative.algorithm import NAME, SpecSoTAlgo, apply_defaults
from sglang_specsot.speculative.registration import register_specsot
from sglang_specsot.speculative.model_draft import model_tree_size


def _args(**over):
    base = dict(
        model_path="/target", speculative_draft_model_path=None, speculative_num_draft_tokens=None,
        speculative_eagle_topk=None, speculative_num_steps=None, page_size=None,
        max_running_requests=None, enable_mixed_chunk=True, device="cpu",
        disable_decode_cuda_graph=False, cuda_graph_backend_decode=None, cuda_graph_config=CudaGraphConfig(),
    )  # fmt: skip
    base.update(over)
    return SimpleNamespace(**base)


def test_defaults():
    sa = _args()
    apply_defaults(sa)
    assert (sa.speculative_num_draft_tokens, sa.speculative_eagle_topk, sa.speculative_num_steps) == (8, 1, 7)
    assert sa.max_running_requests == 48 and sa.enable_mixed_chunk is False
    assert sa.disable_decode_cuda_graph is False  # CPU has no decode graphs to disable


def test_cuda_turns_sglangs_decode_capture_off_and_keeps_the_flags():
    sa = _args(device="cuda")
    apply_defaults(sa)
    # The worker captures its own verify graphs, per tier, when the flags ask for graphs.
    assert sa.disable_decode_cuda_graph is False
    # The config the graph runners read, not only the flag it was derived from
    # (tests/unit/speculative/test_gpu_launch.py resolves a whole launch).
    assert sa.cuda_graph_config.decode.backend == "disabled" and sa.cuda_graph_config.prefill == CudaGraphConfig().prefill


def test_user_values_kept():
    sa = _args(speculative_num_draft_tokens=4, max_running_requests=8)
    apply_defaults(sa)
    assert (sa.speculative_num_draft_tokens, sa.speculative_num_steps, sa.max_running_requests) == (4, 3, 8)


@pytest.mark.parametrize(
    ("over", "flag"),
    [
        (dict(speculative_num_draft_tokens=1), "--speculative-num-draft-tokens"),
        (dict(speculative_num_draft_tokens=65), "--speculative-num-draft-tokens"),
        (dict(speculative_eagle_topk=4), "--speculative-eagle-topk"),
        (dict(speculative_num_draft_tokens=6, speculative_num_steps=3), "--speculative-num-steps"),
        (dict(page_size=16), "--page-size"),
    ],
)
def test_impossible_combinations_name_the_flag(over, flag):
    with pytest.raises(ValueError, match=f"SPECSOT: {flag}=.*; "):
        apply_defaults(_args(**over))


def test_register_is_idempotent_and_resolves():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    register_specsot()
    register_specsot()
    algo = SpeculativeAlgorithm.from_string("specsot")
    assert isinstance(algo, SpecSoTAlgo) and algo.name == NAME and algo.supports_overlap
    assert algo.is_speculative() and not (algo.is_eagle() or algo.is_standalone() or algo.is_ngram())
    # Outside a scheduler no config is published: context drafting's identity.
    assert not algo.need_topk() and not algo.carries_draft_hidden_states() and not algo.has_draft_kv()
    assert not algo.supports_grammar_overlap()
    assert algo.get_platform_worker_cls() is None


def _draft_args(tmp_path, target_vocab=100, draft_vocab=100, **over):
    for name, vocab in (("target", target_vocab), ("draft", draft_vocab)):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "config.json").write_text(json.dumps({"vocab_size": vocab}))
    return _args(model_path=str(tmp_path / "target"), speculative_draft_model_path=str(tmp_path / "draft"), **over)


def test_draft_model_defaults_leave_room_for_context_nodes(tmp_path):
    sa = _draft_args(tmp_path)
    apply_defaults(sa)
    # A 4-step chain (5 nodes incl. the root) plus 3 SoT-context nodes.
    assert (sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens) == (4, 1, 8)
    assert model_tree_size(4, 1, 8) == 5


def test_draft_model_tree_configuration(tmp_path):
    sa = _draft_args(tmp_path, speculative_num_steps=3, speculative_eagle_topk=4)
    apply_defaults(sa)
    assert sa.speculative_num_draft_tokens == 1 + 3 * 4 + 3
    # An explicit window narrower than the tree: the model fills all of it.
    assert model_tree_size(3, 4, 8) == 8


@pytest.mark.parametrize(
    ("over", "flag"),
    [
        (dict(speculative_num_steps=4, speculative_num_draft_tokens=4), "--speculative-num-draft-tokens"),
        (dict(speculative_eagle_topk=11), "--speculative-eagle-topk"),
        (dict(speculative_num_steps=0), "--speculative-num-steps"),
        (dict(speculative_num_draft_tokens=65), "--speculative-num-draft-tokens"),
        (dict(page_size=4), "--page-size"),
    ],
)
def test_impossible_draft_model_combinations_name_the_flag(tmp_path, over, flag):
    with pytest.raises(ValueError, match=f"SPECSOT: {flag}=.*; "):
        apply_defaults(_draft_args(tmp_path, **over))


def test_draft_model_with_a_larger_vocabulary_is_refused_at_launch(tmp_path):
    # A smaller one may be a prefix of the target's (test_vocab_prefix.py); a larger one never is.
    with pytest.raises(ValueError, match="--speculative-draft-model-path=.*vocab_size is 150 but the target's is 100"):
        apply_defaults(_draft_args(tmp_path, draft_vocab=150))


def test_topk_is_refused_without_a_draft_model():
    with pytest.raises(ValueError, match="--speculative-eagle-topk=4.*--speculative-draft-model-path"):
        apply_defaults(_args(speculative_eagle_topk=4))


def test_one_worker_class_drafts_with_or_without_a_draft_model():
    # The worker picks its drafter from the flags (the SoT context, or a draft model merged with it).
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_specsot.speculative.worker import SpecSoTWorker

    register_specsot()
    algo = SpeculativeAlgorithm.from_string("SPECSOT")
    plain = algo.factory(SimpleNamespace(speculative_draft_model_path=None))
    model = algo.factory(SimpleNamespace(speculative_draft_model_path="/m"))
    assert plain is model is SpecSoTWorker


# -- EAGLE heads ------------------------------------------------------------------------------

TARGET = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 8}
EAGLE3 = {"architectures": ["LlamaForCausalLMEagle3"], "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 1,
          "draft_vocab_size": 32, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}}  # fmt: skip


def _head_args(tmp_path, target=TARGET, head=EAGLE3, **over):
    for name, config in (("target", target), ("head", head)):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    return _args(model_path=str(tmp_path / "target"), speculative_draft_model_path=str(tmp_path / "head"), **over)


def test_a_head_takes_the_draft_model_defaults(tmp_path):
    sa = _head_args(tmp_path)
    apply_defaults(sa)
    assert (sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens) == (4, 1, 8)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vocab_size": 120}, "EAGLE3 head, but its vocab_size is 120 and the target's is 100"),
        ({"hidden_size": 32}, "reads hidden states of size 32 and the target's hidden_size is 64"),
        ({"hidden_size": 32, "target_hidden_size": 48}, "reads hidden states of size 48"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 7]}}, r"\[1, 3, 7\] are not all within 0\.\.6"),
        ({"architectures": ["Qwen9ForCausalLMEagle3"]}, r"SGLang has no model class for its architectures \['Qwen9ForCausalLMEagle3'\]"),
    ],
)
def test_a_head_that_cannot_draft_for_the_target_is_refused_at_launch(tmp_path, change, message):
    with pytest.raises(ValueError, match=f"SPECSOT: --speculative-draft-model-path=.*{message}.*SpecForge"):
        apply_defaults(_head_args(tmp_path, head={**EAGLE3, **change}))


def test_an_eagle3_head_over_a_target_that_cannot_capture_aux_states_is_refused(tmp_path):
    target = {**TARGET, "architectures": ["GPT2LMHeadModel"]}
    with pytest.raises(ValueError, match=r"EAGLE3 head, but SGLang's class for the target's architectures \['GPT2LMHeadModel'\]"):
        apply_defaults(_head_args(tmp_path, target=target))


def test_an_eagle2_head_needs_no_aux_capture(tmp_path):
    target = {**TARGET, "architectures": ["GPT2LMHeadModel"]}
    head = {**EAGLE3, "architectures": ["LlamaForCausalLMEagle"]}
    apply_defaults(_head_args(tmp_path, target=target, head=head))  # no refusal


def test_the_algorithm_opts_into_eagles_paths_for_a_head_only(tmp_path, monkeypatch):
    from sglang_specsot.speculative import algorithm

    algo = SpecSoTAlgo(NAME, lambda sa: None, supports_overlap=True)
    for name, config in (("model", {"architectures": ["LlamaForCausalLM"]}), ("eagle", EAGLE3 | {"architectures": ["LlamaForCausalLMEagle"]}), ("eagle3", EAGLE3)):  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    cases = {None: (False, False, False, False), "model": (True, False, False, True),
             "eagle": (False, True, False, True), "eagle3": (False, True, True, True)}  # fmt: skip
    for name, expected in cases.items():
        path = None if name is None else str(tmp_path / name)
        monkeypatch.setattr(algorithm.sgl, "get_spec", lambda path=path: SimpleNamespace(speculative_draft_model_path=path))
        got = (algo.is_standalone(), algo.is_eagle(), algo.is_eagle3(), algo.need_topk())
        assert got == expected, (name, got)
        assert algo.has_draft_kv() == (name is not None) and algo.carries_draft_hidden_states() == expected[1]
