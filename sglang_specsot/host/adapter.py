"""Every SGLang name sglang-specsot uses from below `sglang`, behind one module.

Internal module paths and private methods moved several times in 2026 (e.g. PR #28093), so
they are all here, with the few public ones (the plugin and registration API) beside them:
one place to fix on the next SGLang. tests/unit/speculative/test_adapter.py fails loudly when
one disappears or a private method's parameters change, and when any other module of the
package uses such a name directly; tests/unit/test_import_graph.py when a module outside
sglang_specsot/host/ imports SGLang's modules.

Names resolve on first use (PEP 562 `__getattr__`), so importing this module costs nothing:
the frontend client needs only `TaggingRuntimeEndpoint`, the scheduler the speculative set.
Where SGLang's contract is a private method, a subclass here gives it a public name.
"""

from __future__ import annotations

import contextlib
import importlib

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
    # Public API: registering SPECSOT (speculative/algorithm.py), the base of a custom logit
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


def verify_graphs_wanted() -> bool:
    """Whether this server asked for decode graphs: not --disable-cuda-graph nor
    --disable-decode-cuda-graph, nor --cuda-graph-backend-decode disabled. SPECSOT's handle
    of the arguments turns SGLang's own decode capture off (speculative/algorithm.py), not
    these flags, so they still say what the user asked."""
    from sglang.srt.runtime_context import get_exec

    graph = get_exec().graph
    backend = graph.cuda_graph_backend_decode
    return not (graph.disable_cuda_graph or graph.disable_decode_cuda_graph or backend == "disabled")


def decode_graphs_asked(server_args) -> bool:
    """Whether the user's flags ask for decode graphs, as an override provider sees them while
    SGLang resolves the server's arguments (the raw flags that `verify_graphs_wanted` reads
    resolved once the server runs)."""
    off = getattr(server_args, "disable_cuda_graph", False) or getattr(server_args, "disable_decode_cuda_graph", False)
    return not (off or getattr(server_args, "cuda_graph_backend_decode", None) == "disabled")


@contextlib.contextmanager
def decode_graphs_on(width: int, num_steps: int | None = None):
    """SGLang's resolved config as a verify of `width` rows per request sees it, with decode
    graphs on (the capture-time override EAGLEWorkerV2._override_worker_state makes,
    eagle_worker_v2.py:1909-1980), for SPECSOT's own captures: SGLang's at model load is off
    (speculative/algorithm.py). Everything is restored when the block ends.

    `num_steps`: the draft model's steps, for its captures (its chain is shorter than the
    window, which also holds SoT-context nodes); a verify capture leaves it at `width - 1`.
    The draft runner sizes its out_cache_loc by this value and the draft worker's
    `draft_forward` checks it against its own `speculative_num_steps`, so the two must agree."""
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase
    from sglang.srt.runtime_context import get_context, get_exec, get_spec

    spec, graph = get_spec(), get_exec().graph
    backup = {
        "speculative_num_steps": spec.speculative_num_steps,
        "speculative_num_draft_tokens": spec.speculative_num_draft_tokens,
        "cuda_graph_config": graph.cuda_graph_config,
    }
    backend = graph.cuda_graph_backend_decode or Backend.FULL
    get_context().override(
        "specsot.verify_capture", speculative_num_steps=num_steps or max(width - 1, 1), speculative_num_draft_tokens=width,
        cuda_graph_config=with_phase(graph.cuda_graph_config, Phase.DECODE, backend=backend),
    )  # fmt: skip
    try:
        yield
    finally:
        get_context().override("specsot.verify_capture_restore", **backup)


def capture_verify_graphs(model_runner, width: int, dummy_input):
    """(attention backend, decode graph runner) of the target's TARGET_VERIFY at `width` rows
    per request, as EAGLEWorkerV2.build_adaptive_runtime_state builds a target state
    (eagle_worker_v2.py:1795-1825): a fresh backend, whose buffers the runner's graphs read.

    The runner is SGLang's decode graph runner class with its capture input replaced
    (`verify_graph_runner_cls`): `dummy_input(custom_mask, width)` builds the verify input every
    graph is captured with, from the runner's own static mask buffer."""
    from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput

    with decode_graphs_on(width):
        # The runner's graphs write their logits into the process's shared buffer, which SGLang
        # builds at start-up only when the target captures decode graphs (SPECSOT's target does
        # not); built here as ModelRunner.ensure_decode_cuda_graphs builds it, sized for `width`
        # rows per request (the cached one is kept when it is large enough).
        model_runner.graph_shared_output = GraphSharedOutput.create_for_model_runner(model_runner)
        init_new_workspace = model_runner.init_new_workspace
        try:
            backend = model_runner._get_attention_backend(init_new_workspace=True)
        finally:
            model_runner.init_new_workspace = init_new_workspace
        runner_cls = verify_graph_runner_cls(model_runner._decode_cuda_graph_runner_cls())
        runner = runner_cls(model_runner, dummy_input, attn_backend=backend, speculative_num_steps=max(width - 1, 1),
                            speculative_num_draft_tokens=width)  # fmt: skip
    return backend, runner


_verify_runner_classes: dict[type, type] = {}


def verify_graph_runner_cls(base: type) -> type:
    """SGLang's decode graph runner class `base`, capturing with a plugin's verify input.

    SGLang builds a graph's capture input in `capture_prepare` -> `get_spec_info`
    (decode_cuda_graph_runner.py:1166, :2069), which knows only its own algorithms (EAGLE,
    STANDALONE, DFlash, NGRAM) and returns None for any other: the graph is then captured
    without a tree mask (triton_backend.py:1321-1330 bakes USE_CUSTOM_MASK off) and every
    replay verifies the tree as a causal chain, whatever mask the replay copies in. The
    subclass returns the plugin's input instead, built on the runner's own mask buffer
    (`self.buffers.custom_mask`, which the replay's metadata fills) at its captured width."""
    if base not in _verify_runner_classes:

        class VerifyGraphRunner(base):
            def __init__(self, model_runner, dummy_input, **kwargs):
                self.dummy_input = dummy_input  # read by get_spec_info while __init__ captures
                super().__init__(model_runner, **kwargs)

            def get_spec_info(self, num_tokens: int):
                spec_info = self.dummy_input(self.buffers.custom_mask, self.speculative_num_draft_tokens)
                # As SGLang's EAGLE input (decode_cuda_graph_runner.py:2095): MTP-style
                # models read spec_info.hidden_states in their forward.
                spec_info.hidden_states = _zero_hidden_states(self.model_runner, num_tokens)
                return spec_info

        VerifyGraphRunner.__name__ = VerifyGraphRunner.__qualname__ = f"SpecSoTVerify{base.__name__}"
        _verify_runner_classes[base] = VerifyGraphRunner
    return _verify_runner_classes[base]


def _zero_hidden_states(model_runner, num_tokens: int):
    """Zero hidden states for `num_tokens` rows in the model's width, dtype and device."""
    import torch

    hidden = model_runner.model_config.hidden_size
    return torch.zeros((num_tokens, hidden), dtype=model_runner.dtype, device=model_runner.device)


def new_forward_batch(batch, model_runner):
    """The ForwardBatch SGLang's TpModelWorker builds from a ScheduleBatch (tp_worker.py:653)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    return ForwardBatch.init_new(batch, model_runner, capture_hidden_mode=None, return_hidden_states_before_norm=False)


@contextlib.contextmanager
def draft_model_context(parallel_layout):
    """What EAGLEWorkerV2 enters around every draft-model forward (eagle_worker_v2.py:1473)."""
    from sglang.srt.layers.moe.utils import (
        speculative_moe_a2a_backend_context,
        speculative_moe_backend_context,
    )
    from sglang.srt.speculative.spec_utils import draft_tp_context

    with (
        draft_tp_context(parallel_layout),
        speculative_moe_backend_context(),
        speculative_moe_a2a_backend_context(),
    ):
        yield


@contextlib.contextmanager
def _forward_replaced(model_runner, wrap):
    """`model_runner.forward` replaced by `wrap(forward)` inside the block; the runner's own
    `forward` (an instance attribute, or the class method) is back when the block ends.

    A change to what SGLang's draft loop does: each use is a "scoped" entry of the host-change
    ledger (host/changes.py), with its reason and upstream diff."""
    forward, own = model_runner.forward, "forward" in vars(model_runner)
    model_runner.forward = wrap(forward)
    try:
        yield
    finally:
        if own:
            model_runner.forward = forward
        else:
            del model_runner.forward


@contextlib.contextmanager
def kept_forward_logits(model_runner):
    """The `logits_output` of every `model_runner.forward` call inside the block, in a list
    (host change keep-draft-extend-logits).

    SGLang's draft-extend (eagle_worker_v2.py:1207-1272) keeps its logits local: for a top-1
    chain it takes the argmax and leaves `topk_p = 1.0` (a chain needs no scores), so the draft
    model's confidence is lost. Its eager path replaces `next_token_logits` on the same object
    with the rows it selected (:1233), so the object kept here holds one row per request
    after the call.
    """
    kept = []

    def wrap(forward):
        def keep(*args, **kwargs):
            out = forward(*args, **kwargs)
            kept.append(out.logits_output)
            return out

        return keep

    with _forward_replaced(model_runner, wrap):
        yield kept


@contextlib.contextmanager
def stoppable_forwards(model_runner, go_on, seen):
    """`model_runner.forward` inside the block: `seen(next_token_logits)` after every call
    that runs; before every call after the first, `go_on()`, and once that says no, this
    call and every later one return the last run's output again, without a forward (host
    change stop-draft-chain-early).

    SGLang's draft loop (eagle_worker_v2.py:816-897) runs every step of the chain and has no
    way to stop; the tokens it takes from a repeated output lie past where the chain stops,
    and are cut before verify.
    """
    last, stopped = None, False

    def wrap(forward):
        def step(*args, **kwargs):
            nonlocal last, stopped
            if last is not None and (stopped or not go_on()):
                stopped = True
                return last
            last = forward(*args, **kwargs)
            seen(last.logits_output.next_token_logits)
            return last

        return step

    with _forward_replaced(model_runner, wrap):
        yield


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


# -- subclasses giving SGLang's private methods a public name -----------------------------------


def _tagging_runtime_endpoint() -> type:
    from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

    class TaggingRuntimeEndpoint(RuntimeEndpoint):
        """A RuntimeEndpoint whose subclasses may add fields to every /generate body."""

        def _add_images(self, s, data):
            # RuntimeEndpoint builds every /generate body inline and passes the finished body
            # through this one method just before posting it (runtime_endpoint.py:109-335).
            super()._add_images(s, data)
            self.extend_generate_body(s, data)

        def extend_generate_body(self, state, body: dict) -> None:
            """Add to the /generate `body` of the program `state` about to post it."""

        def get_server_info(self) -> dict:
            """SGLang's /server_info, or behind SGLang's gateway, which forwards only the older
            /get_server_info route (smg 1.13 answers /server_info with a 404), that route's
            answer: the same (http_server.py:853-866)."""
            from sglang.utils import http_request

            res = http_request(self.base_url + "/server_info", api_key=self.api_key, verify=self.verify)
            if res.status_code == 404:
                res = http_request(self.base_url + "/get_server_info", api_key=self.api_key, verify=self.verify)
            self._assert_success(res)
            return res.json()

    return TaggingRuntimeEndpoint


def _public_draft_stages(base: type, name: str) -> type:
    """SGLang's draft worker `base` with its draft-extend stages under public names."""

    class PublicDraftStages(base):
        def _rebuild_topk1_chain_buffers(self) -> None:
            self.rebuild_chain_buffers(super()._rebuild_topk1_chain_buffers)

        def rebuild_chain_buffers(self, rebuild) -> None:
            """Build SGLang's top-k 1 chain buffers by calling `rebuild()`; subclasses may wrap it
            (SGLang calls it from __init__ and whenever the step count changes)."""
            rebuild()

        def refresh_chain_buffers(self) -> None:
            """Rebuild SGLang's top-k 1 chain buffers for the current step count (draft_forward
            reads them; SGLang's own adaptive worker rebuilds them when it changes steps)."""
            self._rebuild_topk1_chain_buffers()

        def draft_extend_for_prefill(self, batch, target_hidden_states, next_token_ids):
            """Draft-extend over the prompt; SGLang's draft input (top-k for step one)."""
            return self._draft_extend_for_prefill(batch, target_hidden_states, next_token_ids)

        def draft_extend_for_decode(self, batch, result) -> None:
            """Draft-extend over the verify window; fills `result.next_draft_input`."""
            self._draft_extend_for_decode(batch, result)

    PublicDraftStages.__name__ = PublicDraftStages.__qualname__ = name
    return PublicDraftStages


def _draft_model_worker() -> type:
    """SGLang's standalone draft worker (a whole draft LM), stages public."""
    from sglang.srt.speculative.standalone_worker_v2 import StandaloneDraftWorker

    return _public_draft_stages(StandaloneDraftWorker, "DraftModelWorker")


def _eagle_head_worker() -> type:
    """SGLang's EAGLE V2 draft worker (an EAGLE or EAGLE-3 head over the target's hidden
    states and embedding), stages public."""
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    return _public_draft_stages(EagleDraftWorker, "EagleHeadWorker")


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


def _spec_worker_base() -> type:
    from sglang.srt.speculative.base_spec_worker import BaseSpecWorker

    class SpecWorkerBase(BaseSpecWorker):
        """SGLang's BaseSpecWorker, whose `target_worker` / `draft_worker` properties read two
        private fields (base_spec_worker.py:202-210), with a public way to set them."""

        def bind_workers(self, target_worker, draft_worker=None) -> None:
            """The workers the scheduler reaches through `target_worker` / `draft_worker`."""
            self._target_worker = target_worker
            self._draft_worker = draft_worker

    return SpecWorkerBase


def _future_map_base() -> type:
    from sglang.srt.managers.overlap_utils import FutureMap

    class FutureMapBase(FutureMap):
        """SGLang's FutureMap with its gather of the relayed spec extras under a public name."""

        def _resolve_spec_extras(self, batch) -> None:
            self.resolve_spec_extras(batch)

        def resolve_spec_extras(self, batch) -> None:
            """Fill `batch.spec_info` with the relayed top-k, bonus tokens and hidden states
            (SGLang's own gather, overlap_utils.py:476-534, unless a subclass overrides it)."""
            FutureMap._resolve_spec_extras(self, batch)

    return FutureMapBase


_CLASSES = {
    "TaggingRuntimeEndpoint": _tagging_runtime_endpoint,
    "DraftModelWorker": _draft_model_worker,
    "EagleHeadWorker": _eagle_head_worker,
    "FutureMapBase": _future_map_base,
    "SpecWorkerBase": _spec_worker_base,
}

__all__ = sorted(
    [*NAMES, *_CLASSES, "ATTENTION_BACKEND_FLAGS", "chosen_attention_backends", "chosen_dtype", "convert_chat_request", "priority_settings", "register_override_provider",
     "draft_model_context", "incremental_streaming_output", "validate_chat_request", "model_class_can_capture_aux",
     "model_architecture_known"]
)  # fmt: skip


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


# -- a draft on a prefix of the target's vocabulary (speculative/vocab.py) -------------------


def clamp_draft_input_ids(draft_runner, size: int) -> None:
    """Make the draft model's embedding read ids at or past `size` as id `size - 1`.

    A draft whose vocabulary is a prefix of the target's is fed the target's committed tokens,
    which may lie past its rows; SGLang's VocabParallelEmbedding does not mask them at TP 1
    (vocab_parallel_embedding.py:516), so the gather would read out of bounds. The draft then
    drafts from a stand-in token, and verify rejects what it gets wrong: output is unchanged."""
    embedding = draft_runner.model.get_input_embeddings()
    last = size - 1

    def clamp(module, args):
        return (args[0].clamp(max=last), *args[1:])

    embedding.register_forward_pre_hook(clamp)


__all__ += ["clamp_draft_input_ids"]


# -- one set of timings for every TP rank (speculative/rank_agreement.py) --------------------


def tp_cpu_group() -> tuple[object, int, int]:
    """(the TP group's CPU (gloo) group, its first rank's global rank, its size), as SGLang's
    own rank-0 broadcasts use it (GroupCoordinator.broadcast_object, spec_tp_sync.py)."""
    from sglang.srt.distributed import get_tp_group

    group = get_tp_group()
    return group.cpu_group, group.ranks[0], group.world_size


__all__ += ["tp_cpu_group"]
