"""Every SGLang name sglang-specsot uses from below `sglang`, behind one module.

Internal module paths and private methods moved several times in 2026 (e.g. PR #28093), so
they are all here, with the few public ones (the plugin and registration API) beside them:
one place to fix on the next SGLang. tests/unit/speculative/test_adapter.py fails loudly when
one disappears or a private method's parameters change, and when any other module of the
package uses such a name directly; tests/unit/test_import_graph.py when a module outside
sglang_specsot/host/ imports SGLang's modules.

Names resolve on first use (PEP 562 `__getattr__`), so importing this module costs nothing:
the frontend client needs only `TaggingRuntimeEndpoint`, the scheduler the speculative set.
Where SGLang's contract is a private method, a subclass gives it a public name
(subclasses.py). The functions over SGLang's objects live here, but for two ideas of their
own that this module re-exports: the verify-graph capture (verify_graphs.py) and the hooks
around draft-model forwards (draft_forwards.py). Callers read every name from this module.
"""

from __future__ import annotations

import importlib

from sglang_specsot.host.draft_forwards import (
    clamp_draft_input_ids,
    draft_model_context,
    kept_forward_logits,
    new_forward_batch,
    stoppable_forwards,
)
from sglang_specsot.host.subclasses import CLASSES as _CLASSES
from sglang_specsot.host.verify_graphs import (
    capture_verify_graphs,
    decode_graphs_asked,
    decode_graphs_on,
    verify_graph_runner_cls,
    verify_graphs_wanted,
)

# name -> the SGLang module that defines it.
NAMES: dict[str, str] = {
    # The SPECSOT workers (speculative/worker.py, drafters/, model_draft.py).
    "assign_extend_cache_locs_func": "sglang.kernels.ops.speculative.cache_locs",
    "reconstruct_indices_from_tree_mask_func": "sglang.kernels.ops.speculative.reconstruct_tree",
    "compute_spec_logprobs": "sglang.srt.layers.logprob_processor",
    "GenerationBatchResult": "sglang.srt.managers.utils",
    "CaptureHiddenMode": "sglang.srt.model_executor.forward_batch_info",
    "ForwardMode": "sglang.srt.model_executor.forward_batch_info",
    "get_device": "sglang.srt.runtime_context",
    "get_spec": "sglang.srt.runtime_context",
    "get_schedule": "sglang.srt.runtime_context",
    "BaseSpecWorker": "sglang.srt.speculative.base_spec_worker",
    "EagleDraftInput": "sglang.srt.speculative.eagle_info",
    "EagleVerifyInput": "sglang.srt.speculative.eagle_info",
    "eagle_sample": "sglang.srt.speculative.eagle_utils",
    "load_token_map": "sglang.srt.speculative.spec_utils",
    "GrammarTree": "sglang.srt.speculative.spec_utils",
    "build_grammar_vocab_mask": "sglang.srt.speculative.spec_utils",
    "commit_mamba_states_after_verify": "sglang.srt.speculative.spec_utils",
    "move_accept_tokens_to_target_kvcache": "sglang.srt.speculative.spec_utils",
    "prepare_mamba_track_for_verify": "sglang.srt.speculative.spec_utils",
    "record_stream_for_v2_verify": "sglang.srt.speculative.spec_utils",
    "sanitize_nan_logits": "sglang.srt.utils.async_probe",
    # Server-side SoT (serving/): the request SGLang's chat route builds, its response models.
    "GenerateReqInput": "sglang.srt.managers.io_struct",
    "ChatCompletionResponse": "sglang.srt.entrypoints.openai.protocol",
    "ChatCompletionResponseChoice": "sglang.srt.entrypoints.openai.protocol",
    "ChatCompletionResponseStreamChoice": "sglang.srt.entrypoints.openai.protocol",
    "ChatCompletionStreamResponse": "sglang.srt.entrypoints.openai.protocol",
    "ChatMessage": "sglang.srt.entrypoints.openai.protocol",
    "DeltaMessage": "sglang.srt.entrypoints.openai.protocol",
    "UsageInfo": "sglang.srt.entrypoints.openai.protocol",
    # Host changes (host/changes.py): SGLang's own torch fallback, used on CPU.
    "get_last_loc_torch": "sglang.srt.mem_cache.allocation",
    # Launch-time choices (cpu/spec_backend.py): SGLang's argument-resolution registry.
    "register_model_override_predicate": "sglang.srt.arg_groups.model_override_base",
    "resolving_view": "sglang.srt.arg_groups.model_override_base",
    "get_platform": "sglang.srt.runtime_context",
    # Launch-time choices (speculative/backend_choice.py): the model's attention, as SGLang's
    # default-backend rule reads it.
    "model_config_of": "sglang.srt.arg_groups.model_override_base",
    "use_mla_backend": "sglang.srt.arg_groups.model_override_base",
    # Launch-time choices (speculative/algorithm.py): the resolved CUDA-graph config.
    "Backend": "sglang.srt.model_executor.cuda_graph_config",  # a CUDA-graph backend
    "Phase": "sglang.srt.model_executor.cuda_graph_config",  # prefill or decode graphs
    "with_phase": "sglang.srt.model_executor.cuda_graph_config",
    # Host changes (host/changes.py): the deserializer of custom logit processors, cached.
    "_cache_from_str": "sglang.srt.sampling.custom_logit_processor",
    # Host changes (host/changes.py): the draft chain's top-k selection, compiled.
    "_select_top_k_tokens_later": "sglang.srt.speculative.spec_utils",
    # Public API: registering SPECSOT (speculative/algorithm.py, registration.py), the base of a custom logit
    # processor (serving/skeleton_constraint.py) and its deserializer (serving/request_checks.py).
    "CustomSpecAlgo": "sglang.srt.speculative.spec_registry",
    "SpeculativeAlgorithm": "sglang.srt.speculative.spec_info",
    "CustomLogitProcessor": "sglang.srt.sampling.custom_logit_processor",
}

# The draft-extend stages and chain buffers SGLang's draft workers keep private.
_DRAFT_STAGES: dict[str, tuple[str, ...]] = {
    "_rebuild_topk1_chain_buffers": ("self",),
    "_draft_extend_for_prefill": (
        "self", "batch", "target_hidden_states", "next_token_ids", "mm_input_embeds", "kv_loc_plan",
    ),
    "_draft_extend_for_decode": ("self", "batch", "batch_result", "kv_loc_plan"),
}  # fmt: skip

# What the adapter calls or overrides on SGLang objects: class -> {method: its parameters}.
PRIVATE_METHODS: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {
    ("sglang.srt.entrypoints.openai.serving_chat", "OpenAIServingChat"): {
        "_validate_request": ("self", "request"),
        "_convert_to_internal_request": ("self", "request", "raw_request"),
    },
    ("sglang.lang.backend.runtime_endpoint", "RuntimeEndpoint"): {
        "_add_images": ("self", "s", "data"),
        "_assert_success": ("self", "res"),
    },
    # Both draft workers `_public_draft_stages` subclasses: the same stages on each.
    ("sglang.srt.speculative.standalone_worker_v2", "StandaloneDraftWorker"): _DRAFT_STAGES,
    ("sglang.srt.speculative.eagle_worker_v2", "EagleDraftWorker"): _DRAFT_STAGES,
    ("sglang.srt.managers.overlap_utils", "FutureMap"): {"_resolve_spec_extras": ("self", "batch")},
    # A verify graph set per tier, as EAGLEWorkerV2.build_adaptive_runtime_state builds one.
    ("sglang.srt.model_executor.model_runner", "ModelRunner"): {
        "_get_attention_backend": ("self", "init_new_workspace"),
        "_decode_cuda_graph_runner_cls": ("self",),
    },
}
# Private fields the adapter sets for SGLang to read: class -> {field: the property reading it}.
PRIVATE_FIELDS: dict[tuple[str, str], dict[str, str]] = {
    ("sglang.srt.speculative.base_spec_worker", "BaseSpecWorker"): {
        "_target_worker": "target_worker",
        "_draft_worker": "draft_worker",
    },
}
# Instance attributes the adapter reads: class -> names SGLang's source sets on `self`.
INSTANCE_ATTRIBUTES: dict[tuple[str, str], tuple[str, ...]] = {
    ("sglang.srt.managers.tokenizer_manager", "TokenizerManager"): ("incremental_streaming_output",),
    ("sglang.srt.model_executor.model_runner", "ModelRunner"): ("init_new_workspace",),
    # What SPECSOT's verify graphs are captured with (verify_graph_runner_cls).
    ("sglang.srt.model_executor.runner.decode_cuda_graph_runner", "DecodeCudaGraphRunner"): (
        "buffers", "speculative_num_draft_tokens",
    ),
}


def __getattr__(name: str):
    if name in NAMES:
        value = getattr(importlib.import_module(NAMES[name]), name)
    elif name in _CLASSES:
        value = _CLASSES[name]()
        value.__module__, value.__qualname__ = __name__, name
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *NAMES, *_CLASSES])


# -- functions over SGLang's private contracts ---------------------------------------------------


# SGLang's attention-backend fields (server_args.py) and the flags that set them.
ATTENTION_BACKEND_FLAGS = {
    "attention_backend": "--attention-backend",
    "prefill_attention_backend": "--prefill-attention-backend",
    "decode_attention_backend": "--decode-attention-backend",
}


def chosen_attention_backends(server_args) -> tuple[str, str | None, dict[str, str | None]]:
    """(device, speculative algorithm, each attention-backend field as the user set it), as an
    override provider sees them while SGLang resolves the server's arguments: the record holds
    the user's raw flags, the resolving view what resolution decided so far (the device)."""
    from sglang.srt.arg_groups.model_override_base import resolving_view

    view = resolving_view(server_args)
    chosen = {field: getattr(server_args, field) for field in ATTENTION_BACKEND_FLAGS}
    return view.device, view.speculative_algorithm, chosen


def chosen_dtype(server_args) -> tuple[str, str, str, str | None]:
    """(device, --dtype as the user set it, model path, draft model path), as an override
    provider sees them while SGLang resolves the server's arguments (the device resolved, the
    rest the user's raw flags)."""
    from sglang.srt.arg_groups.model_override_base import resolving_view

    view = resolving_view(server_args)
    return view.device, server_args.dtype, server_args.model_path, server_args.speculative_draft_model_path


_providers: set = set()


def register_override_provider(provider) -> None:
    """Add `provider` ((record, hf_config) -> declarations) to SGLang's model-override registry
    for every architecture, once per process (load_plugins may run a plugin twice): the
    attention backend SPECSOT needs depends on the device and algorithm, not the model."""
    if provider in _providers:
        return
    from sglang.srt.arg_groups.model_override_base import register_model_override_predicate

    register_model_override_predicate(lambda architecture: True)(provider)
    _providers.add(provider)


def priority_settings(tokenizer_manager) -> tuple[bool, int | None, bool]:
    """(--enable-priority-scheduling, --default-priority-value,
    --schedule-low-priority-values-first) as the HTTP process's TokenizerManager serves them
    (tokenizer_manager.py:603-604; the last from SGLang's schedule config, as the scheduler
    reads it, scheduler.py:491)."""
    from sglang.srt.runtime_context import get_schedule

    enabled = bool(getattr(tokenizer_manager, "enable_priority_scheduling", False))
    if not enabled:
        return False, None, False
    return True, tokenizer_manager.default_priority_value, bool(get_schedule().schedule_low_priority_values_first)


def simulated_accept_len() -> int:
    """SGLANG_SIMULATE_ACC_LEN as eagle_sample reads it (spec_utils.py:276; off when <= 0)."""
    return importlib.import_module("sglang.srt.speculative.spec_utils").SIMULATE_ACC_LEN


def uncached_processor_deserializer():
    """SGLang's deserializer of custom logit processors without its unbounded cache
    (custom_logit_processor.py:15-21: `_cache_from_str` is an `lru_cache(maxsize=None)`)."""
    return importlib.import_module(NAMES["_cache_from_str"])._cache_from_str.__wrapped__


def eager_select_top_k_tokens_later():
    """SGLang's top-k selection of draft steps 2+ without its `torch.compile` wrapper
    (spec_utils.py:437; the wrapper's `__wrapped__` is the function as written)."""
    return importlib.import_module(NAMES["_select_top_k_tokens_later"])._select_top_k_tokens_later.__wrapped__


def validate_chat_request(serving, request) -> str | None:
    """SGLang's own check of a chat request (serving_chat.py:1103); the problem, or None."""
    return serving._validate_request(request)


def convert_chat_request(serving, request, raw_request):
    """SGLang's chat request as its GenerateReqInput (serving_chat.py:1276): rendered with the
    chat template, sampling defaults applied. ValueError for a request it cannot serve."""
    adapted, _ = serving._convert_to_internal_request(request, raw_request)
    return adapted


def request_token_room(tokenizer_manager) -> int:
    """The prompt and completion tokens one request may total: the context less the tokens
    SGLang reserves per request (tokenizer_manager.py:1333-1335)."""
    return tokenizer_manager.context_len - getattr(tokenizer_manager, "num_reserved_tokens", 0)


def sglang_binds_cpu_threads() -> bool:
    """Whether SGLang pins a CPU scheduler's OpenMP threads to its SGLANG_CPU_OMP_THREADS_BIND
    cores itself: on AMX or arm64 CPUs only, by the same two checks (distributed/bootstrap.py:53-54,
    :283)."""
    from sglang.srt.utils import cpu_has_amx_support, is_host_cpu_arm64

    return bool(cpu_has_amx_support() or is_host_cpu_arm64())


def dp_size(tokenizer_manager) -> int:
    """The data-parallel ranks `routed_dp_rank` may name: the ranks the tokenizer manager checks
    it against (tokenizer_manager.py:915-923, `elastic_worker_count`), else --dp-size."""
    count = getattr(tokenizer_manager, "elastic_worker_count", None)
    if count:
        return int(count)
    return int(getattr(getattr(tokenizer_manager, "server_args", None), "dp_size", 1) or 1)


def incremental_streaming_output(tokenizer_manager) -> bool:
    """Whether a streamed generation yields only the new text of each step (the server's
    --incremental-streaming-output) rather than all text so far."""
    return tokenizer_manager.incremental_streaming_output


def delay_sample_enabled() -> bool:
    """Whether SGLANG_ENABLE_DELAY_SAMPLE is on, read as SGLang reads it (environ.py:697): the
    plain overlap scheduler then samples after the previous token reaches `output_ids`."""
    from sglang.srt.environ import envs

    return bool(envs.SGLANG_ENABLE_DELAY_SAMPLE.get())


def model_class_can_capture_aux(architectures: list[str]) -> bool | None:
    """Whether SGLang's model class for `architectures` captures EAGLE-3's aux hidden states
    (attention_backend_setup.py:54-61 requires `set_eagle3_layers_to_capture`); None where
    SGLang has no class for them. Imports SGLang's model registry (seconds): launch time only."""
    from sglang.srt.models.registry import ModelRegistry

    try:
        cls, _ = ModelRegistry.resolve_model_cls(architectures)
    except ValueError:
        return None
    return hasattr(cls, "set_eagle3_layers_to_capture")


def model_architecture_known(architectures: list[str]) -> bool:
    """Whether SGLang registers a model class under one of `architectures` (launch time only)."""
    from sglang.srt.models.registry import ModelRegistry

    return any(ModelRegistry.is_arch_supported(a) for a in architectures)


__all__ = sorted(
    [*NAMES, *_CLASSES, "ATTENTION_BACKEND_FLAGS", "chosen_attention_backends", "chosen_dtype", "convert_chat_request", "priority_settings", "register_override_provider",
     "incremental_streaming_output", "validate_chat_request", "model_class_can_capture_aux",
     "model_architecture_known"]
)  # fmt: skip
# Re-exported from the adapter's parts.
__all__ += ["clamp_draft_input_ids", "draft_model_context", "kept_forward_logits", "new_forward_batch",
            "stoppable_forwards", "capture_verify_graphs", "decode_graphs_asked", "decode_graphs_on",
            "verify_graph_runner_cls", "verify_graphs_wanted"]  # fmt: skip


# -- launch refusals (speculative/backend_choice.py) -----------------------------------------


def linear_attention_config_name(model_config) -> str | None:
    """The class name of the model's hybrid linear-attention / Mamba config, or None: the
    rule by which SGLang wraps the model's attention in HybridLinearAttnBackend
    (attention_registry.py:392), whose verify walks a tree only for topk > 1."""
    from sglang.srt.configs.hybrid_arch import mambaish_config

    config = mambaish_config(model_config)
    return None if config is None else type(config).__name__


def splitkv_verify_on() -> bool:
    """Whether SGLang's Triton verify would run its split-KV kernel, which is causal: ROCm
    gfx95 with SGLANG_ENABLE_SPLITKV_VERIFY on (its default) and topk 1 (triton_backend.py:236)."""
    from sglang.srt import utils
    from sglang.srt.environ import envs
    from sglang.srt.runtime_context import get_platform

    if not get_platform().is_hip:
        return False
    return bool(utils.is_gfx95_supported() and envs.SGLANG_ENABLE_SPLITKV_VERIFY.get())


__all__ += ["linear_attention_config_name", "splitkv_verify_on"]


# -- one set of timings for every TP rank (speculative/rank_agreement.py) --------------------


def tp_cpu_group() -> tuple[object, int, int]:
    """(the TP group's CPU (gloo) group, its first rank's global rank, its size), as SGLang's
    own rank-0 broadcasts use it (GroupCoordinator.broadcast_object, spec_tp_sync.py)."""
    from sglang.srt.distributed import get_tp_group

    group = get_tp_group()
    return group.cpu_group, group.ranks[0], group.world_size


__all__ += ["tp_cpu_group"]
