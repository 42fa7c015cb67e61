"""A SPECSOT launch on a GPU, resolved by SGLang's own argument resolution (`ServerArgs` and
`resolve_once`, as the launcher runs them) on this CPU, with the GPU's facts faked through
SGLang's `override_platform`: its attention backend attends by the verify tree's mask, and the
config SGLang's graph runners read captures no decode graph SPECSOT cannot replay.

CPU twins of what only a CUDA machine would run: the launch itself needs no GPU, only the
facts SGLang asks of it (compute capability, whether FlashInfer imports).
"""

from __future__ import annotations

import json
import os

import pytest
from sglang.srt.arg_groups.model_override_base import attention_backends_of, resolved_view
from sglang.srt.arg_groups.overrides import resolution_result
from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend
from sglang.srt.runtime_context import create_context, override_platform, use_context
from sglang.srt.server_args import ServerArgs

from sglang_specsot.speculative.registration import register_specsot
from sglang_specsot.speculative.backend_choice import tree_backend_declaration

# An H100/H200 with CUDA >= 12.3: where SGLang picks FlashAttention-3 for a model like this one
# when --speculative-eagle-topk is unset or 1 (model_override_base.py:305).
HOPPER = dict(is_cuda=True, is_sm90=True, is_hopper_with_cuda_12_3=True, device_capability=(9, 0), device_sm=90)
# A checkpoint's config.json is all argument resolution reads of it.
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "head_dim": 32,
    "intermediate_size": 352, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4,
    "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "dtype": "bfloat16",
    "tie_word_embeddings": False,
}  # fmt: skip


@pytest.fixture
def checkpoint(tmp_path) -> str:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    return str(tmp_path)


@pytest.fixture
def resolve(checkpoint):
    """Resolve a CUDA launch of `checkpoint` as SGLang's launcher does, with SPECSOT registered
    as the plugin registers it; resolution sets SGLang's environment variables, put back after."""
    register_specsot()
    saved = dict(os.environ)

    def run(has_flashinfer: bool = False, draft_model: bool = False, **flags) -> ServerArgs:
        if draft_model:
            flags["speculative_draft_model_path"] = checkpoint
        with override_platform(**HOPPER, has_flashinfer=has_flashinfer):
            sa = ServerArgs(model_path=checkpoint, device="cuda", **flags)
            sa.resolve_once()
        return sa

    yield run
    os.environ.clear()
    os.environ.update(saved)


def _attention(sa: ServerArgs) -> tuple[str, str]:
    """The (prefill, decode) attention backends the launch resolved to."""
    return attention_backends_of(resolved_view(sa))


def _captures_decode_graphs(sa: ServerArgs) -> bool:
    """What the target's and the draft's graph capture ask before capturing (cuda_graph_setup.py:731,
    eagle_worker_v2.py:481), in the config a scheduler publishes from this launch."""
    with use_context(create_context(sa, role="scheduler")):
        return not check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)


# -- the attention backend -----------------------------------------------------------------------


@pytest.mark.parametrize("draft_model", [False, True], ids=["context-draft", "draft-model"])
@pytest.mark.parametrize(
    ("has_flashinfer", "graphs_off", "chosen"),
    [(False, False, "triton"), (True, False, "triton"), (True, True, "flashinfer"), (False, True, "triton")],
)
def test_backend_choice_on_hopper_is_a_tree_backend(resolve, draft_model, has_flashinfer, graphs_off, chosen, caplog):
    caplog.set_level("INFO", logger="sglang_specsot.speculative.backend_choice")
    flags = {"disable_cuda_graph": True} if graphs_off else {}
    sa = resolve(has_flashinfer=has_flashinfer, draft_model=draft_model, speculative_algorithm="SPECSOT", **flags)
    # FlashInfer only where it imports and no verify graph is captured: SGLang's Triton
    # capture is the one shown to carry the tree (tests/unit/speculative/test_own_capture.py).
    assert _attention(sa) == (chosen, chosen)
    assert ("captures its verify graphs with Triton" in caplog.text) == (has_flashinfer and not graphs_off)


def test_backend_choice_leaves_other_launches_to_sglang(resolve):
    # The same machine without SPECSOT: SGLang's own FA3, so the faked Hopper is what SGLang sees.
    assert _attention(resolve()) == ("fa3", "fa3")
    assert _attention(resolve(speculative_algorithm="NGRAM")) == ("fa3", "fa3")


@pytest.mark.parametrize("flag", ["attention_backend", "decode_attention_backend", "prefill_attention_backend"])
def test_backend_choice_refuses_fa3_naming_the_flag_and_the_fix(resolve, flag):
    with pytest.raises(ValueError) as err:
        resolve(speculative_algorithm="SPECSOT", **{flag: "fa3"})
    message = str(err.value)
    assert f"--{flag.replace('_', '-')} fa3" in message and "SPECSOT" in message
    assert "--attention-backend triton" in message


@pytest.mark.parametrize("backend", ["trtllm_mha", "fa4", "flashmla"])
def test_backend_choice_refuses_any_backend_that_does_not_attend_by_the_tree(backend):
    chosen = {"attention_backend": None, "prefill_attention_backend": None, "decode_attention_backend": backend}
    with pytest.raises(ValueError, match=f"--decode-attention-backend {backend} does not"):
        tree_backend_declaration("cuda", "SPECSOT", chosen, default="triton")
    assert tree_backend_declaration("cpu", "SPECSOT", chosen, default="triton") == {}  # cpu/spec_backend.py's


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_backend_choice_keeps_a_tree_backend_the_user_chose(resolve, backend):
    sa = resolve(has_flashinfer=True, speculative_algorithm="SPECSOT", attention_backend=backend)
    assert _attention(sa) == (backend, backend)


def test_backend_choice_fills_the_phase_the_user_left_unset(resolve):
    sa = resolve(speculative_algorithm="SPECSOT", decode_attention_backend="triton")
    assert _attention(sa) == ("triton", "triton")  # not SGLang's FA3 for prefill (and verify)


# -- the decode graphs ---------------------------------------------------------------------------


@pytest.mark.parametrize("draft_model", [False, True], ids=["context-draft", "draft-model"])
def test_resolved_cuda_graph_config_captures_no_decode_graph(resolve, draft_model):
    sa = resolve(draft_model=draft_model, speculative_algorithm="SPECSOT")
    assert resolution_result(sa, "cuda_graph_config").decode.backend == Backend.DISABLED
    assert not _captures_decode_graphs(sa)


def test_a_decode_graph_asked_for_is_left_to_the_worker(resolve):
    # SGLang captures none at model load; the flag stays, and the worker's verify capture
    # reads it (adapter.verify_graphs_wanted, adapter.decode_graphs_on).
    sa = resolve(speculative_algorithm="SPECSOT", cuda_graph_backend_decode="full")
    assert not _captures_decode_graphs(sa)
    assert resolution_result(sa, "cuda_graph_backend_decode") == "full"


def test_resolved_cuda_graph_config_of_other_launches_is_sglangs(resolve):
    assert _captures_decode_graphs(resolve())  # plain decoding on the same machine keeps its graphs


# -- the captures SPECSOT makes itself (the H200 device check found both) -------------------------


def _scheduler_context(sa: ServerArgs):
    return use_context(create_context(sa, role="scheduler"))


def test_draft_capture_sizes_its_cache_slots_by_the_draft_models_steps(resolve):
    # A 4-step chain verified in a 6-node window (1 SoT-context node): SGLang's draft runner
    # sizes out_cache_loc by the steps the capture sees, and draft_forward checks that size
    # against the draft worker's own steps (eagle_utils.per_step_draft_out_cache_loc).
    import torch
    from sglang.srt.runtime_context import get_spec
    from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc

    from sglang_specsot.host import adapter

    sa = resolve(draft_model=True, speculative_algorithm="SPECSOT", speculative_num_draft_tokens=6)
    with _scheduler_context(sa):
        draft_steps = get_spec().speculative_num_steps
        assert draft_steps == 4
        with adapter.decode_graphs_on(6, num_steps=draft_steps):
            assert not check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
            captured = torch.zeros(3 * get_spec().speculative_eagle_topk * get_spec().speculative_num_steps)
            assert get_spec().speculative_num_draft_tokens == 6
        per_step_draft_out_cache_loc(captured, 3, 1, draft_steps)  # raises where the sizes differ
        assert get_spec().speculative_num_steps == draft_steps  # restored
        with adapter.decode_graphs_on(6):
            assert get_spec().speculative_num_steps == 5  # a verify capture: width - 1
        assert check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)


class _RunnerWithoutSharedLogits:
    """What capture_verify_graphs reads of a target ModelRunner whose decode graphs SGLang
    did not capture at start-up (SPECSOT's): no shared logits buffer yet."""

    device = "cpu"
    init_new_workspace = False

    def __init__(self, rows_per_request_seen: list):
        self.graph_shared_output = None
        self.rows_per_request_seen = rows_per_request_seen

    def max_shared_logits_buffer_rows(self) -> int:
        from sglang.srt.runtime_context import get_spec

        return 4 * get_spec().speculative_num_draft_tokens  # 4 requests, a window each

    def _get_attention_backend(self, init_new_workspace: bool):
        return "backend"

    def _decode_cuda_graph_runner_cls(self):
        seen = self.rows_per_request_seen

        class Runner:
            def __init__(self, model_runner, attn_backend, speculative_num_steps, speculative_num_draft_tokens):
                # SGLang's DecodeCudaGraphRunner takes its logits buffer here (decode_cuda_graph_runner.py:475)
                buffer = model_runner.graph_shared_output.get_logits_buffer(8, rows=4 * speculative_num_draft_tokens)
                seen.append(buffer.shape[0] // 4)

        return Runner


def test_verify_capture_builds_the_shared_logits_buffer_sglang_skipped(resolve):
    from sglang_specsot.host import adapter

    sa = resolve(speculative_algorithm="SPECSOT", speculative_num_draft_tokens=6)
    seen: list = []
    runner = _RunnerWithoutSharedLogits(seen)
    with _scheduler_context(sa):
        for width in (1, 4, 6):
            backend, graphs = adapter.capture_verify_graphs(runner, width, dummy_input=lambda mask, w: None)
            assert backend == "backend" and graphs.dummy_input(None, width) is None  # SPECSOT's runner class
    assert seen == [1, 4, 6]
