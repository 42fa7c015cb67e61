"""The dtype a CPU server runs in when the user left `--dtype auto`: what a start-up timing
measures faster on this CPU (costs/dtype_choice.py), said in the log.

The choice is a declaration through SGLang's public override registry, as the attention
backend's is (cpu/spec_backend.py): argument resolution runs it once per launch, before the
model config reads `dtype`. An explicit `--dtype`, a GPU, a quantized checkpoint (its dtype is
its quantization's business) or a config without the MLP's sizes leave SGLang's choice alone.
"""

from __future__ import annotations

import functools
import logging

from sglang_specsot.costs import dtype_choice, memory
from sglang_specsot.costs.dtype_choice import DtypeChoice

logger = logging.getLogger(__name__)

_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def checkpoint_dtype(hf_config) -> str | None:
    """The checkpoint's dtype as a name ("bfloat16"), from `dtype` (or the older `torch_dtype`)."""
    value = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    return None if value is None else str(value).removeprefix("torch.")


def fp32_weight_bytes(paths, stored: str | None) -> int | None:
    """The weights of the checkpoints in `paths` (local directories) in float32, from their files'
    sizes and the dtype they are stored in; None when a path is not a local directory or holds
    no weight file."""
    if stored not in _BYTES:
        return None
    sizes = [memory.weight_file_bytes(path) for path in paths]
    if not all(sizes):
        return None
    return sum(sizes) * 4 // _BYTES[stored]


@functools.lru_cache(maxsize=8)
def _timed(hidden: int, intermediate: int, half: str) -> tuple[tuple[str, float], ...]:
    # Cached: argument resolution may run more than once in a process; one timing is enough.
    return tuple(dtype_choice.time_dtypes(hidden, intermediate, half).items())


def cpu_dtype_choice(chosen: tuple, hf_config, timer=None) -> DtypeChoice | None:
    """The choice for a launch, or None where it is not ours to make (see the module).

    `chosen` is (device, --dtype as the user set it, model path, draft model path);
    `timer(hidden, intermediate, half)` gives each dtype's timed product as (dtype, ms) pairs
    (the real timing by default)."""
    timer = timer or _timed
    device, dtype, model_path, draft_path = chosen
    if device != "cpu" or dtype != "auto" or getattr(hf_config, "quantization_config", None):
        return None
    text = getattr(hf_config, "text_config", None) or hf_config
    hidden, intermediate = getattr(text, "hidden_size", None), getattr(text, "intermediate_size", None)
    if not isinstance(hidden, int) or not isinstance(intermediate, int):
        logger.info("--dtype auto on CPU: the config names no MLP sizes to time; keeping SGLang's choice")
        return None
    stored = checkpoint_dtype(hf_config)
    half = dtype_choice.half_dtype(stored)
    paths = [p for p in (model_path, draft_path) if p]
    return dtype_choice.choose_dtype(
        half, dict(timer(hidden, intermediate, half)), fp32_weight_bytes(paths, stored), memory.available_bytes()
    )


def _declare_cpu_dtype(server_args, hf_config) -> dict[str, str]:
    # A provider in SGLang's override registry: (record, hf_config) -> declarations.
    from sglang_specsot.host import adapter as sgl

    choice = cpu_dtype_choice(sgl.chosen_dtype(server_args), hf_config)
    if choice is None:
        return {}
    logger.info("sglang-specsot: %s", choice.message())
    return {"dtype": choice.dtype} if choice.changed else {}


def register_dtype_choice() -> None:
    """Register the choice with SGLang's argument resolution, once per process."""
    from sglang_specsot.host import adapter as sgl

    sgl.register_override_provider(_declare_cpu_dtype)
