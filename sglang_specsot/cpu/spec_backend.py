"""The attention backend a speculative server on CPU launches with.

SGLang fills an unset `--attention-backend` on CPU with `intel_amx`, which falls back to
`torch_native` on a CPU without AMX (platform_hook.py:158-168, overrides.py:1301-1310),
whatever the speculative algorithm. `torch_native` cannot verify drafts: the server reports
"fired up" and its scheduler dies on the first verify (torch_native_backend.py:101,
`seq_lens` of None). So, for any speculative algorithm on CPU: no backend chosen ->
`specsot_cpu` is chosen (and logged); a backend chosen that cannot verify -> the launch
stops, naming the flag to add.

The choice is a declaration through SGLang's public override registry
(`register_model_override_predicate`, model_override_base.py:50), which every launch runs in
argument resolution (model_hook.py:233) after the CPU default (platform_hook.py:158) and
before the attention backend is resolved (pipeline.py:241): no host change is needed.
"""

from __future__ import annotations

import logging
import os

from sglang_specsot.cpu.attention import BACKEND_NAME
from sglang_specsot.host.adapter import ATTENTION_BACKEND_FLAGS

logger = logging.getLogger(__name__)

# The flags that choose an attention backend, as ServerArgs fields. Prefill and decode
# fall back to --attention-backend when unset (model_override_base.py:138-152).
BACKEND_FLAGS = ATTENTION_BACKEND_FLAGS
FIX = f"--attention-backend {BACKEND_NAME}"


def verifies_drafts(backend: str | None, has_amx: bool, triton_interpreted: bool = False) -> bool:
    """Whether `backend` can run a speculative verify on CPU (None: SGLang's CPU default)."""
    # intel_amx verifies (intel_amx_backend.py:83) but only runs with AMX; without it SGLang
    # silently swaps in torch_native, as it does for an unset backend. SGLang's Triton backend
    # verifies wherever Triton runs: on a CPU only under its interpreter (TRITON_INTERPRET=1),
    # far too slow to serve; scripts/cuda_draft_twin.py runs SGLang's CUDA draft path so.
    return (
        backend == BACKEND_NAME
        or (backend in (None, "intel_amx") and has_amx)
        or (backend == "triton" and triton_interpreted)
    )  # fmt: skip


def spec_backend_declaration(
    device: str | None, algorithm: str | None, chosen: dict[str, str | None], has_amx: bool,
    triton_interpreted: bool = False,
) -> dict[str, str]:  # fmt: skip
    """The attention backend to declare for this launch ({} for none); ValueError when the
    user chose one that cannot verify drafts. `chosen` maps BACKEND_FLAGS fields to the
    user's raw values."""
    if device != "cpu" or algorithm is None:
        return {}
    if all(value is None for value in chosen.values()):
        logger.info(
            "--speculative-algorithm %s on CPU: no attention backend chosen, using %s, which "
            "verifies drafts on any CPU (SGLang's default, torch_native without AMX, cannot)", algorithm, FIX,
        )  # fmt: skip
        # Also with AMX: intel_amx needs a CPU build of sgl-kernel, which our shim is not.
        return {"attention_backend": BACKEND_NAME}
    bad = {
        field: value for field, value in chosen.items()
        if value is not None and not verifies_drafts(value, has_amx, triton_interpreted)
    }  # fmt: skip
    # A split flag alone leaves the other phase on SGLang's CPU default.
    if chosen.get("attention_backend") is None and not verifies_drafts(None, has_amx):
        bad["attention_backend"] = None
    if bad:
        raise ValueError(_refusal(algorithm, bad))
    return {}


def _refusal(algorithm: str, bad: dict[str, str | None]) -> str:
    named = " and ".join(
        f"{BACKEND_FLAGS[field]} {value}" if value else f"{BACKEND_FLAGS[field]} unset (SGLang's CPU default)"
        for field, value in bad.items()
    )
    amx = " (intel_amx runs only on a CPU with AMX, which this one lacks)" if "intel_amx" in bad.values() else ""
    return (
        f"--speculative-algorithm {algorithm} on CPU needs an attention backend that verifies "
        f"drafts, and {named} cannot{amx}: the scheduler would die on the first verify. "
        f"Use {FIX} (alone), or pass no attention-backend flag to have {BACKEND_NAME} chosen for you"
    )


def _declare_spec_backend(server_args, hf_config) -> dict[str, str]:
    # A provider in SGLang's override registry: (record, hf_config) -> declarations.
    from sglang_specsot.host import adapter as sgl

    device, algorithm, chosen = sgl.chosen_attention_backends(server_args)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return spec_backend_declaration(device, algorithm, chosen, sgl.get_platform().has_amx, interpreted)


def register_spec_backend_choice() -> None:
    """Register the choice with SGLang's argument resolution, once per process."""
    from sglang_specsot.host import adapter as sgl

    sgl.register_override_provider(_declare_spec_backend)
