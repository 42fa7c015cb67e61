"""SPECSOT's registration and server-argument defaults and validation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_specsot.spec.algorithm import NAME, SpecSoTAlgo, apply_defaults, register_specsot


def _args(**over):
    base = dict(
        speculative_draft_model_path=None, speculative_num_draft_tokens=None,
        speculative_eagle_topk=None, speculative_num_steps=None, page_size=None,
        max_running_requests=None, enable_mixed_chunk=True, device="cpu",
        disable_decode_cuda_graph=False,
    )  # fmt: skip
    base.update(over)
    return SimpleNamespace(**base)


def test_defaults():
    sa = _args()
    apply_defaults(sa)
    assert (sa.speculative_num_draft_tokens, sa.speculative_eagle_topk, sa.speculative_num_steps) == (8, 1, 7)
    assert sa.max_running_requests == 48 and sa.enable_mixed_chunk is False
    assert sa.disable_decode_cuda_graph is False  # CPU has no decode graphs to disable


def test_cuda_disables_decode_graphs():
    sa = _args(device="cuda")
    apply_defaults(sa)
    assert sa.disable_decode_cuda_graph is True


def test_user_values_kept():
    sa = _args(speculative_num_draft_tokens=4, max_running_requests=8)
    apply_defaults(sa)
    assert (sa.speculative_num_draft_tokens, sa.speculative_num_steps, sa.max_running_requests) == (4, 3, 8)


@pytest.mark.parametrize(
    ("over", "flag"),
    [
        (dict(speculative_draft_model_path="/m"), "--speculative-draft-model-path"),
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
    assert not algo.need_topk() and not algo.carries_draft_hidden_states() and not algo.has_draft_kv()
    assert algo.get_platform_worker_cls() is None
