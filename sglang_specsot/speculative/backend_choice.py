"""The attention backend SPECSOT verifies with on a CUDA GPU: one that attends by the tree.

A SPECSOT verify is one TARGET_VERIFY forward over a token tree (SoT-context branches; a
draft model's chain or tree plus context nodes), whose attention must follow the tree's mask.
Triton and FlashInfer read it (triton_backend.py:1051, flashinfer_backend.py:1327);
FlashAttention-3 with top-k 1 attends a causal chain of fixed width
(flashattention_backend.py:223, :1036), so branches would see each other and a narrower step
would read past its window. SGLang picks FA3 on Hopper whenever --speculative-eagle-topk is
unset or 1 (model_override_base.py:305), and it resolves the attention backend
(pipeline.py:242) before the speculative hook runs SPECSOT's handle_server_args (:306).

So the choice is declared, like cpu/spec_backend.py's, through SGLang's public override
registry (`register_model_override_predicate`), which argument resolution runs
(model_hook.py:233) before it fills the default backend: no backend chosen -> a tree backend
is chosen and logged; a backend chosen that cannot attend by the tree -> the launch stops,
naming the flag and the fix.

Some launches would pass that check and still verify every tree as a chain, silently: wrong
tokens past the first branch, with nothing in the log. They are refused here too, before any
weight loads (`silent_chain_refusal`): FlashInfer on an MLA model, a hybrid linear-attention
or Mamba model, and ROCm's split-KV verify.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sglang_specsot.host import adapter as sgl

logger = logging.getLogger(__name__)

ALGORITHM = "SPECSOT"
TREE_BACKENDS = ("triton", "flashinfer")
# The flags that choose an attention backend, as ServerArgs fields. Prefill and decode fall
# back to --attention-backend when unset; verify runs on either (hybrid_attn_backend.py:81).
BACKEND_FLAGS = sgl.ATTENTION_BACKEND_FLAGS


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What the silent-chain refusals read of the model and the machine, as SGLang's own rules
    for choosing a verify kernel read them (the defaults: a launch none of them applies to)."""

    mla: bool = False  # SGLang attends with an MLA backend (its use_mla_backend)
    architecture: str = ""  # the model's first architecture, for the messages
    linear_attention: str | None = None  # the hybrid linear-attention / Mamba config's class
    splitkv_verify: bool = False  # ROCm gfx95 with SGLANG_ENABLE_SPLITKV_VERIFY on


# Why a launch that captures verify graphs verifies with Triton, for the log and /server_info.
GRAPHS_WITH_TRITON = (
    "SPECSOT captures its verify graphs with Triton: SGLang's Triton capture is shown to carry "
    "SPECSOT's tree mask (scripts/own_capture_twin.py runs it), FlashInfer's capture cannot be run "
    "where this project is tested, so it is not used for graphs (pass --attention-backend "
    "flashinfer to choose it anyway, or --disable-cuda-graph to verify eagerly with it)"
)


def tree_backend(has_flashinfer: bool, plain_mha: bool, graphs: bool = False) -> str:
    """FlashInfer where it imports and serves the model (SGLang's own rule for a model
    without FA3, model_override_base.py:332: MHA without attention sinks) and verifies
    eagerly; Triton where verify graphs are captured (GRAPHS_WITH_TRITON), or elsewhere."""
    return "flashinfer" if has_flashinfer and plain_mha and not graphs else "triton"


def tree_backend_declaration(
    device: str | None, algorithm: str | None, chosen: dict[str, str | None], default: str,
    facts: ModelFacts = ModelFacts(),
) -> dict[str, str]:  # fmt: skip
    """The attention backend to declare for this launch ({} for none); ValueError when the
    user chose one that cannot attend by a tree. `chosen` maps BACKEND_FLAGS fields to the
    user's raw values; `default` is the tree backend for a flag left unset."""
    if str(algorithm).upper() != ALGORITHM:
        return {}
    on_cuda = str(device).split(":")[0] == "cuda"
    bad = {field: value for field, value in chosen.items() if value is not None and value not in TREE_BACKENDS}
    if on_cuda and bad:  # first: the fix for a backend that attends by no tree is another backend
        raise ValueError(_refusal(bad))
    refusal = silent_chain_refusal(device, algorithm, chosen, facts)
    if refusal is not None:
        raise ValueError(refusal)
    if not on_cuda:
        return {}
    if chosen.get("attention_backend") is not None:
        return {}
    # Also with only --prefill/--decode-attention-backend given: the other phase falls back
    # to --attention-backend, which SGLang would fill with FA3 on Hopper.
    logger.info(
        "--speculative-algorithm %s on CUDA: --attention-backend unset, using %s, which verifies "
        "token trees (SGLang's default on Hopper, FA3, verifies only a chain)", ALGORITHM, default,
    )  # fmt: skip
    return {"attention_backend": default}


def silent_chain_refusal(
    device: str | None, algorithm: str | None, chosen: dict[str, str | None], facts: ModelFacts
) -> str | None:
    """Why this launch would verify every tree as a chain with no error (None where it would
    not): SGLang's verify kernels in these configurations follow the causal order of the
    window and ignore the tree mask, which only its EAGLE with topk > 1 would not hit."""
    if str(algorithm).upper() != ALGORITHM:
        return None
    spec = f"--speculative-algorithm {ALGORITHM}"
    if facts.linear_attention is not None:
        # hybrid_linear_attn_backend.py:298: the linear-attention / Mamba state follows the
        # tree (retrieve_next_token/sibling) only where topk > 1; SPECSOT runs topk 1.
        return (
            f"{spec} on --model-path of architecture {facts.architecture} ({facts.linear_attention}): "
            "its linear-attention / Mamba layers update their state along the verify window as a "
            "chain (SGLang walks the tree only for --speculative-eagle-topk > 1, which SPECSOT "
            f"does not run), so every branching tree would be verified wrong. Drop {spec} for "
            "this model (SGLang's EAGLE with --speculative-eagle-topk > 1 verifies trees on it)"
        )  # fmt: skip
    if str(device).split(":")[0] != "cuda":
        return None
    flashinfer = {f: v for f, v in chosen.items() if v == "flashinfer"}
    if facts.mla and flashinfer:
        named = " and ".join(f"{BACKEND_FLAGS[f]} flashinfer" for f in flashinfer)
        # flashinfer_mla_backend.py:1108-1181: the verify plan is causal and the mask dropped.
        return (
            f"{spec} with {named} on an MLA model ({facts.architecture}): FlashInfer's MLA "
            "verify plans causal attention and drops the tree mask, so every branching tree "
            "would be verified as a chain. Use --attention-backend triton, or pass no "
            "attention-backend flag to have one chosen for you"
        )  # fmt: skip
    if facts.splitkv_verify:
        # triton_backend.py:236: on gfx95 with topk 1 Triton's verify is split-KV, causal.
        return (
            f"{spec} on ROCm gfx95 with SGLANG_ENABLE_SPLITKV_VERIFY=1 (SGLang's default there): "
            "Triton's split-KV verify kernel attends causally and ignores the tree mask, so every "
            "branching tree would be verified as a chain. Set SGLANG_ENABLE_SPLITKV_VERIFY=0"
        )  # fmt: skip
    return None


def _refusal(bad: dict[str, str]) -> str:
    named = " and ".join(f"{BACKEND_FLAGS[field]} {value}" for field, value in bad.items())
    fa3 = (
        " (FlashAttention-3 verifies a causal chain of fixed width: a tree's branches would "
        "attend to each other)" if "fa3" in bad.values() else ""
    )  # fmt: skip
    return (
        f"--speculative-algorithm {ALGORITHM} verifies token trees, with an attention backend "
        f"that attends by the tree's mask ({' or '.join(TREE_BACKENDS)}), and {named} does not{fa3}. "
        f"Use --attention-backend triton (or flashinfer where it is installed) instead, or pass "
        f"no attention-backend flag to have one chosen for you"
    )


def _declare_tree_backend(server_args, hf_config) -> dict[str, str]:
    # A provider in SGLang's override registry: (record, hf_config) -> declarations.
    device, algorithm, chosen = sgl.chosen_attention_backends(server_args)
    # The model's config is built by now (model_hook.py:165) and memoized on the record.
    mla = sgl.use_mla_backend(server_args)
    model_config = sgl.model_config_of(server_args)
    plain_mha = not mla and not model_config.has_attention_sinks
    graphs = sgl.decode_graphs_asked(server_args)
    default = tree_backend(sgl.get_platform().has_flashinfer, plain_mha, graphs)
    if graphs and default != tree_backend(sgl.get_platform().has_flashinfer, plain_mha):
        logger.info(GRAPHS_WITH_TRITON)
    facts = ModelFacts(
        mla=mla, architecture=(model_config.hf_config.architectures or ["?"])[0],
        linear_attention=sgl.linear_attention_config_name(model_config), splitkv_verify=sgl.splitkv_verify_on(),
    )  # fmt: skip
    return tree_backend_declaration(device, algorithm, chosen, default, facts)


def register_tree_backend_choice() -> None:
    """Register the choice with SGLang's argument resolution, once per process."""
    sgl.register_override_provider(_declare_tree_backend)
