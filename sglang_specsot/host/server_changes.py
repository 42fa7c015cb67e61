"""The host changes every server takes, whatever its device: the chat route, its body check
and the request checks (the HTTP server's process only), the processor cache, SPECSOT's
/server_info reports and its verify warm-up input, in the order applied.

Entries of the one ledger, host/changes.py, which applies them after SGLang's CPU path's
(cpu_changes.py); read that module for what an entry is and how each hook type is applied.
"""

from __future__ import annotations

from collections.abc import Callable

from sglang_specsot.host.host_change import HostChange, http_server_only

SERVER_CHANGES: list[HostChange] = []


# --- Server-side SoT on the OpenAI chat route (sglang_specsot/serving/) -----------------------


SERVER_CHANGES.append(
    HostChange(
        name="sot-chat-route",
        target="sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat.handle_request",
        hook_type="around",
        hook=None,  # serving/chat.py: sot_chat_hook(), which refuses a bad server default
        why=(
            "OpenAIServingChat inherits handle_request (sglang/srt/entrypoints/openai/"
            "serving_base.py:80-147), which validates, converts and generates one answer; no "
            "seam lets a plugin answer a chat request itself. The hook answers requests that "
            "opt in (the `specsot` field, or SGLANG_SPECSOT_SOT_MODE) by Skeleton-of-Thought and "
            "hands every other request to the original as it came. A FastAPI middleware or "
            "route would have to re-parse and re-validate every request instead."
        ),
        patch="chat-request-handlers.diff",
        when=http_server_only,
    )
)


# --- A chat request whose body is no JSON object: a 400, not a 500 (serving/chat_body.py) ------


SERVER_CHANGES.append(
    HostChange(
        name="chat-body-is-an-object",
        target="sglang.srt.entrypoints.http_server.ORJSONRequest.json",
        hook_type="around",
        hook=None,  # serving/chat_body.py: chat_body_around
        why=(
            "The chat route's body model, ChatCompletionRequest, has 'before' validators that call "
            "values.get() before pydantic checks that the body is an object (sglang/srt/entrypoints/"
            "openai/protocol.py:1078, :1097, :1157), so a JSON array as the body raises AttributeError "
            "and FastAPI answers 500. No seam validates a body before its model: the hook checks the "
            "body where SGLang parses every request's JSON (http_server.py:478, ORJSONRequest.json) "
            "and refuses a non-object on the chat route with an HTTPException(400), which FastAPI "
            "re-raises and SGLang's handler sends as its usual error. The diff instead lets those "
            "validators pass a non-object through, so pydantic's own check refuses it (a 400)."
        ),
        patch="chat-body-is-an-object.diff",
        when=http_server_only,
    )
)


# --- Requests that would kill the scheduler, refused with a 400 (serving/request_checks.py) ----


SERVER_CHANGES.append(
    HostChange(
        name="reject-unservable-requests",
        target="sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        hook_type="after",
        hook=None,  # serving/request_checks.py: validate_one_request_after
        why=(
            "TokenizerManager._validate_one_request (sglang/srt/managers/tokenizer_manager.py:"
            "1307-1437) is SGLang's per-request check, whose ValueError the HTTP routes answer "
            "with a 400; it lets through an input of 0 tokens (the CPU forward then dies in "
            "rotary_embedding/base.py:347) and a custom_logit_processor that does not "
            "deserialize (the scheduler dies in custom_logit_processor.py:20), and either kills "
            "the server. No seam adds a request check; a middleware would have to tokenize. "
            "The hook runs after SGLang's checks and refuses both; it also covers server-side "
            "SoT's generations (specsot.skeleton_logit_processor), which go through it."
        ),
        patch="reject-unservable-requests.diff",
        when=http_server_only,
    )
)


# --- A bounded cache of deserialized custom logit processors ------------------------------------

PROCESSOR_CACHE_SIZE = 64  # distinct processor strings kept deserialized per process


def _bounded_processor_cache_hook() -> Callable:
    import functools

    from sglang_specsot.host import adapter as sgl

    # SGLang's own deserializer, undecorated, under a bounded cache of the same kind.
    return functools.lru_cache(maxsize=PROCESSOR_CACHE_SIZE)(sgl.uncached_processor_deserializer())


SERVER_CHANGES.append(
    HostChange(
        name="bounded-processor-cache",
        target="sglang.srt.sampling.custom_logit_processor._cache_from_str",
        hook_type="replace",
        hook=_bounded_processor_cache_hook,
        why=(
            "CustomLogitProcessor.from_str deserializes through _cache_from_str, an "
            "lru_cache(maxsize=None) (sglang/srt/sampling/custom_logit_processor.py:15): every "
            "distinct processor string a client sends stays deserialized in the scheduler (and, "
            "with our request checks, the HTTP server) for the life of the process. Server-side "
            "SoT sends one string per distinct SoTConfig, which clients choose, so a client "
            "varying its config could grow the server's memory without bound. The cache keeps "
            "the last 64."
        ),
        patch="bounded-processor-cache.diff",
    )
)


# --- SPECSOT's cost model and budgets in /server_info (speculative/server_info.py) ----------------


SERVER_CHANGES.append(
    HostChange(
        name="server-info-specsot",
        target=(
            "sglang.srt.managers.scheduler_components.internal_state."
            "SchedulerInternalStateController._add_speculative"
        ),
        hook_type="after",
        hook=None,  # speculative/server_info.py: add_speculative_after
        why=(
            "/server_info reports each scheduler's internal state, whose speculative part "
            "(managers/scheduler_components/internal_state.py:119-129) is the average accept "
            "length plus a report SGLang asks only of DSpark workers (is_dspark()); a plugin "
            "worker has no way to add its own. The hook adds SPECSOT's measured cost model, "
            "acceptance estimates and last budget plan under 'specsot'; it runs only where the "
            "scheduler's spec worker has speculative_state_report()."
        ),
        patch="server-info-spec-worker-report.diff",
    )
)


# --- SPECSOT's verify graphs (speculative/verify_runners.py) ------------------------------------


SERVER_CHANGES.append(
    HostChange(
        name="specsot-dummy-verify-input",
        target="sglang.srt.speculative.spec_info.create_dummy_verify_input",
        hook_type="around",
        hook=None,  # speculative/verify_input.py: dummy_verify_input_around
        why=(
            "SGLang's warm-up forward (BaseRunner._dummy_run, model_executor/runner/base_runner.py:"
            "653, run by the FlashInfer autotune before the first capture, :408) builds its "
            "TARGET_VERIFY input with create_dummy_verify_input (sglang/srt/speculative/"
            "spec_info.py:476-548), which dispatches on SGLang's own algorithms only and returns "
            "None for a plugin's; the hook returns SPECSOT's input (the runner's mask buffer, its "
            "width) for SPECSOT's target runner and calls SGLang's function for everything else. "
            "The verify graphs' capture takes its input elsewhere, from DecodeCudaGraphRunner."
            "get_spec_info (decode_cuda_graph_runner.py:2069), which never calls this function: "
            "SPECSOT's runner class answers there (host/adapter.py verify_graph_runner_cls, a "
            "subclass, no host change); the diff gives both seams to a registered algorithm."
        ),
        patch="dummy-verify-input-plugin.diff",
    )
)


SERVER_CHANGES.append(
    HostChange(
        name="draft-model-bigram-radix-keys",
        target="sglang.srt.mem_cache.registry.create_tree_cache",
        hook_type="around",
        hook=None,  # speculative/radix_keys.py: create_tree_cache_around
        why=(
            "The draft worker of STANDALONE, whose draft side SPECSOT with a draft model is, "
            "reads its input one token ahead (eagle_worker_v2.py:991): draft KV slot p holds "
            "token p + 1. build_kv_cache keys the radix tree by token pairs only for EAGLE "
            "(kv_cache_builder.py:401, is_eagle(); radix_cache.py:401), so with a draft model a "
            "prefix matched on single tokens reuses, at its last slot, the draft KV of the token "
            "that followed it in the request that cached it: every SoT branch after the first, "
            "and any prompt sharing a system prompt, drafts from a wrong token (a SmolLM2 "
            "drafting for itself lost whole steps on the second of two prompts). The hook sets "
            "the builder's is_eagle for SPECSOT with a draft model before the tree is built; "
            "SGLang's own STANDALONE is left as shipped. The diff gives STANDALONE the pairs too."
        ),
        patch="draft-model-bigram-radix-keys.diff",
    )
)

# --- Every server's row-cost curve, measured at start-up and in /server_info (costs/) -----------
# One upstream diff, two entries: the probe once the model is loaded, and its report. Server-side
# SoT prices its answers by the curve (sot/latency.py) on every server, whatever its algorithm.

_ROW_COSTS_PATCH = "row-cost-probe.diff"

SERVER_CHANGES.append(
    HostChange(
        name="row-cost-probe",
        target=(
            "sglang.srt.managers.scheduler_components.internal_state."
            "SchedulerInternalStateController.__init__"
        ),
        hook_type="after",
        hook=None,  # costs/probe.py: probe_after_start_up
        why=(
            "SGLang measures no forward's cost by rows; SPECSOT's worker probes its target at "
            "start-up, but a server of any other algorithm has no such curve, and SoT's routing "
            "needs it on every server. No seam runs plugin code once the model is loaded and "
            "before serving: the scheduler builds its internal-state controller at start-up after "
            "its model workers (sglang/srt/managers/scheduler.py:735, after :568), and the hook "
            "probes the target's weight products by rows there (costs/probe.py), where SPECSOT "
            "has not published its own."
        ),
        patch=_ROW_COSTS_PATCH,
    )
)

SERVER_CHANGES.append(
    HostChange(
        name="server-info-row-costs",
        target=(
            "sglang.srt.managers.scheduler_components.internal_state."
            "SchedulerInternalStateController.get_internal_state"
        ),
        hook_type="after",
        hook=None,  # costs/published.py: add_row_costs_after
        why=(
            "/server_info returns each scheduler's internal state "
            "(managers/scheduler_components/internal_state.py:45-63), which a plugin cannot add "
            "to. The hook adds the scheduler's row-cost curve (the start-up probe, or SPECSOT's "
            "cost model with the overhead it learned from real steps) under 'specsot_row_costs', "
            "where the HTTP process reads it (TokenizerManager.get_internal_state) to price SoT."
        ),
        patch=_ROW_COSTS_PATCH,
    )
)
