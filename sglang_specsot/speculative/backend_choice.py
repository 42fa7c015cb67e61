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
"""

from __future__ import annotations

import logging

from sglang_specsot.host import adapter as sgl

logger = logging.getLogger(__name__)

ALGORITHM = "SPECSOT"
TREE_BACKENDS = ("triton", "flashinfer")
# The flags that choose an attention backend, as ServerArgs fields. Prefill and decode fall
# back to --attention-backend when unset; verify runs on either (hybrid_attn_backend.py:81).
BACKEND_FLAGS = sgl.ATTENTION_BACKEND_FLAGS


def tree_backend(has_flashinfer: bool, plain_mha: bool) -> str:
    """FlashInfer where it imports and serves the model (SGLang's own rule for a model
    without FA3, model_override_base.py:332: MHA without attention sinks), else Triton."""
    return "flashinfer" if has_flashinfer and plain_mha else "triton"


def tree_backend_declaration(
    device: str | None, algorithm: str | None, chosen: dict[str, str | None], default: str
) -> dict[str, str]:
    """The attention backend to declare for this launch ({} for none); ValueError when the
    user chose one that cannot attend by a tree. `chosen` maps BACKEND_FLAGS fields to the
    user's raw values; `default` is the tree backend for a flag left unset."""
    if str(device).split(":")[0] != "cuda" or str(algorithm).upper() != ALGORITHM:
        return {}
    bad = {field: value for field, value in chosen.items() if value is not None and value not in TREE_BACKENDS}
    if bad:
        raise ValueError(_refusal(bad))
    if chosen.get("attention_backend") is not None:
        return {}
    # Also with only --prefill/--decode-attention-backend given: the other phase falls back
    # to --attention-backend, which SGLang would fill with FA3 on Hopper.
    logger.info(
        "--speculative-algorithm %s on CUDA: --attention-backend unset, using %s, which verifies "
        "token trees (SGLang's default on Hopper, FA3, verifies only a chain)", ALGORITHM, default,
    )  # fmt: skip
    return {"attention_backend": default}


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
    plain_mha = not sgl.use_mla_backend(server_args) and not sgl.model_config_of(server_args).has_attention_sinks
    default = tree_backend(sgl.get_platform().has_flashinfer, plain_mha)
    return tree_backend_declaration(device, algorithm, chosen, default)


def register_tree_backend_choice() -> None:
    """Register the choice with SGLang's argument resolution, once per process."""
    sgl.register_override_provider(_declare_tree_backend)
