"""Every change sglang-specsot makes to SGLang's behaviour, in one ordered list.

Each entry is applied through SGLang's own `HookRegistry` (sglang/srt/plugins/hook_registry.py),
names the SGLang file:line it changes, says why no public seam served, and has the same
change as an upstream-ready diff against sglang 0.5.23 in `patches/` (checked by
tests/unit/test_patches.py). Entries whose `when` is false in this process are skipped: most
apply on SGLang's CPU path only, the chat route and the request checks in the HTTP server's
process only.

What an entry installs is built by its `hook` factory. Where that is code of another package
(cpu/, serving/, speculative/, each of which imports this one), the entry's `hook` is None and
the caller of `apply_host_changes` supplies the factory by the entry's name: the plugin, from
sglang_specsot/wiring.py. So the list stays whole here and this package imports none of them.

`HookRegistry.apply_hooks` logs and swallows failures, so `apply_host_changes` re-checks
that every applied target is really wrapped and raises otherwise.

Three hook types are not HookRegistry's:
- "bind" fills a module-level name that SGLang sets to None on this platform (a kernel it has
  no implementation for). HookRegistry cannot patch a None: its propagation
  (hook_registry.py:320-347) rewrites every module attribute that `is` the original, and an
  SGLang CPU process has thousands of None globals.
- "environ" sets an environment variable that SGLang's processes read (`target` names it):
  the hook sets it, for the processes this one starts. No SGLang code is touched.
- "scoped" changes what one SGLang method (`target`) does, for the length of one call, on
  sglang-specsot's own objects only: the hook is the adapter function that makes the change
  around each call (host/adapter.py). Applying the entry changes nothing at start-up and does
  not import the method's module (seconds of a CPU process's start-up); tests/unit/host/
  checks that the method exists.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostChange:
    """One change to SGLang: a hook on `target`, with its reason and patch."""

    name: str
    target: str  # dotted path, as HookRegistry.register takes it ("environ": the variable)
    # "before" | "after" | "around" | "replace" (HookRegistry's) | "bind" | "environ" |
    # "scoped" (see module doc)
    hook_type: str
    # Returns the hook callable (lazy: may import torch/SGLang); None where the factory is
    # code of another package, supplied to apply_host_changes by name (see module doc).
    hook: Callable[[], Callable] | None
    why: str  # what SGLang does at file:line and why no public seam served
    patch: str  # file name under patches/
    when: Callable[[], bool] = field(default=lambda: True)


def _cpu_only() -> bool:
    from sglang_specsot._bootstrap import cpu_engine_requested

    return cpu_engine_requested()


_HTTP_LAUNCHERS = ("sglang/launch_server.py", "sglang/cli/serve.py")


def _http_server_only() -> bool:
    """Whether this is the process of SGLang's HTTP server (the one with the chat route)."""
    # The launchers call load_plugins() under `if __name__ == "__main__"`, so only the
    # server's main process has them on its stack; spawned children do not.
    return any(
        frame.filename.replace(os.sep, "/").endswith(_HTTP_LAUNCHERS) for frame in traceback.extract_stack()
    )


# The ordered list. Later entries may rely on earlier ones having been applied.
HOST_CHANGES: list[HostChange] = []


def register_host_change(change: HostChange) -> HostChange:
    """Append a change to HOST_CHANGES; a name or target may appear only once."""
    for existing in HOST_CHANGES:
        if existing.name == change.name or existing.target == change.target:
            raise ValueError(
                f"host change {change.name!r} on {change.target} duplicates {existing.name!r}; "
                "merge them into one entry"
            )
    HOST_CHANGES.append(change)
    return change


_applied: list[str] = []


def applied_host_changes() -> list[str]:
    """Names of the host changes applied in this process, in order."""
    return list(_applied)


def _resolve(target: str):
    obj_path, attr = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(obj_path)
    # For class attributes compare the raw descriptor: getattr would build a fresh bound
    # method for a classmethod each time, so an unpatched target would look patched.
    if isinstance(owner, type) and attr in vars(owner):
        return vars(owner)[attr]
    return getattr(owner, attr)


def _bind_unset_name(target: str, value: object) -> None:
    """Set `target`, None on this platform, in its module and in every loaded SGLang module
    that imported that None under the same name (`from module import name`)."""
    module_name, attr = target.rsplit(".", 1)
    module = importlib.import_module(module_name)
    assert getattr(module, attr) is None, f"bind only fills a None name; {target} is set"
    for mod in [module, *list(sys.modules.values())]:
        name = getattr(mod, "__name__", None)
        is_importer = isinstance(name, str) and name.startswith("sglang.")
        if mod is module or (is_importer and vars(mod).get(attr, False) is None):
            setattr(mod, attr, value)


def apply_host_changes(supplied: Mapping[str, Callable[[], Callable]] = MappingProxyType({})) -> list[str]:
    """Register every applicable change with HookRegistry, apply, and verify. Idempotent.

    `supplied` maps the name of every entry whose `hook` is None to its hook factory."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    expected = {c.name for c in HOST_CHANGES if c.hook is None}
    assert set(supplied) == expected, (
        f"host changes implemented outside sglang_specsot/host/ need their hooks supplied: "
        f"missing {sorted(expected - set(supplied))}, unknown {sorted(set(supplied) - expected)}"
    )
    pending = [c for c in HOST_CHANGES if c.name not in _applied and c.when()]
    # Every hook is built before anything is changed: a factory that refuses (e.g. a bad
    # setting, as SystemExit) leaves SGLang untouched.
    hooks = {change.name: (change.hook or supplied[change.name])() for change in pending}
    originals = {}  # change name -> its target before, where the change replaces it (checked below)
    for change in pending:
        hook = hooks[change.name]
        if change.hook_type == "environ":
            hook()
        elif change.hook_type == "scoped":
            continue  # the hook makes the change around each call
        elif change.hook_type == "bind":
            originals[change.name] = _resolve(change.target)
            _bind_unset_name(change.target, hook)
        else:
            originals[change.name] = _resolve(change.target)
            assert originals[change.name] is not None, (
                f"host change {change.name!r}: {change.target} is None here; use hook_type 'bind'"
            )
            HookRegistry.register(change.target, hook, HookType(change.hook_type))
    HookRegistry.apply_hooks()
    for change in pending:
        if change.name in originals and _resolve(change.target) is originals[change.name]:
            raise RuntimeError(
                f"sglang-specsot host change {change.name!r} was not applied to {change.target}; "
                "see the HookRegistry error logged above (is this SGLang 0.5.23?)"
            )
        _applied.append(change.name)
        logger.info("sglang-specsot: applied host change %s -> %s", change.name, change.target)
    return applied_host_changes()


# --- CPU: OpenMP workers kept awake between a step's ops (sglang_specsot/cpu/threads.py) -------


register_host_change(
    HostChange(
        name="omp-spin-on-cpu",
        target="GOMP_SPINCOUNT",
        hook_type="environ",
        hook=None,  # cpu/threads.py: keep_workers_spinning
        why=(
            "On SGLang's CPU path torch's intra-op pool runs on libgomp, whose workers spin "
            "GOMP_SPINCOUNT times after a parallel region (300,000, a few ms) and then sleep. "
            "A decode step is hundreds of small regions with Python between them, so a region "
            "after a longer gap waits for a wake-up, and a speculative step, with more Python "
            "between its forwards, loses more to it than plain decoding. SGLang sets the "
            "environment its schedulers inherit in _set_envs_and_config "
            "(sglang/srt/entrypoints/engine.py:1878), but nothing of OpenMP's, and libgomp "
            "reads the variable once, when torch loads. The hook sets it to 10M (about 0.1 s) "
            "in the launching process, unless the user set it or OMP_WAIT_POLICY."
        ),
        patch="cpu-omp-spin-count.diff",
        when=_cpu_only,
    )
)


register_host_change(
    HostChange(
        name="cpu-threads-bind-without-amx",
        target="sglang.srt.distributed.bootstrap._init_cpu_threads_env",
        hook_type="around",
        hook=None,  # cpu/threads.py: threads_bind_around
        why=(
            "SGLang reads a CPU rank's cores from SGLANG_CPU_OMP_THREADS_BIND "
            "(utils/numa_utils.py:459-497) but binds its threads to them only on AMX or arm64 "
            "CPUs, through sgl-kernel's init_cpu_threads_env (distributed/bootstrap.py:283-285); "
            "on other x86 CPUs it logs a warning and each scheduler keeps every core. Two "
            "replicas or two --dp-size ranks on one machine then each run a pool as wide as the "
            "machine, their spinning workers taking turns on every core: two SmolLM2 replicas "
            "bound to cores 0 and 1 on a 2-core EPYC decoded about 5 tokens/s each under load. "
            "Where the user set the variable and SGLang did not bind, the hook pins the "
            "scheduler's threads to its rank's cores and sizes torch's pool to them."
        ),
        patch="cpu-threads-bind-without-amx.diff",
        when=_cpu_only,
    )
)


# --- Attention entries: the `specsot_cpu` backend (sglang_specsot/cpu/attention.py) ------------


register_host_change(
    HostChange(
        name="draft-backend-factory-specsot-cpu",
        target="sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend",
        hook_type="around",
        hook=None,  # cpu/draft_attention.py: draft_backend_factory_around
        why=(
            "DraftBackendFactory.create_decode_backend / create_draft_extend_backend build "
            "hard-coded backend maps (sglang/srt/speculative/draft_utils.py:97-150) and "
            "_create_backend (:47-82) raises 'EAGLE is not supported in ... attention backend' "
            "for any other name, so EAGLE/EAGLE3/STANDALONE cannot start with a registered "
            "backend. No registry or platform seam exists there; the hook adds specsot_cpu's "
            "multi-step draft-decode and draft-extend backends to the map being looked up."
        ),
        patch="draft-backend-factory-registry.diff",
        when=_cpu_only,
    )
)


def _last_loc_hook() -> Callable:
    from sglang_specsot.host.adapter import get_last_loc_torch

    return get_last_loc_torch


register_host_change(
    HostChange(
        name="last-loc-torch-on-cpu",
        target="sglang.srt.mem_cache.allocation.get_last_loc",
        hook_type="replace",
        hook=_last_loc_hook,
        why=(
            "get_last_loc (sglang/srt/mem_cache/allocation.py:113-117) picks its Triton kernel "
            "for every attention backend not named 'ascend' or 'torch_native', whatever the "
            "platform; with --attention-backend specsot_cpu and --page-size > 1, speculative "
            "decoding (alloc_for_spec_decode, :797) then launches Triton on the CPU and the "
            "scheduler dies ('0 active drivers'). On CPU the torch version is always the right "
            "one, and the patch returns it there before the name-based dispatch."
        ),
        patch="last-loc-platform-dispatch.diff",
        when=_cpu_only,
    )
)


# --- Lossless sampling in speculative verify on CPU (sglang_specsot/cpu/sampling.py) ----------
# One upstream diff, four entries: the torch ops fill the names SGLang leaves None on CPU
# (binds first, so eagle_utils imported by the last entry already sees them), then CPU verify
# stops forcing greedy.

_SAMPLING_PATCH = "cpu-sampling-verify.diff"
_SAMPLING_WHY = (
    "eagle_sample (sglang/srt/speculative/eagle_utils.py:641) commits the target argmax whenever "
    "_verify_uses_greedy (:485-500) sees is_cpu, because on CPU "
    "{name} is None ({where}); speculative decoding on CPU thus changes the output "
    "distribution of every request with temperature > 0. No platform seam supplies the op; "
    "this fills the name with the torch version in sglang_specsot/cpu/sampling.py."
)

for _module, _name, _where in [
    (
        "sglang.kernels.ops.speculative.verify_sampling",
        "tree_speculative_sampling_target_only",
        "sglang/kernels/ops/speculative/verify_sampling.py:31-32; the JIT-CUDA kernel is "
        "kernels/ops/speculative/sampling.py:33",
    ),
    ("sglang.kernels.ops.sampling.renorm", "top_k_renorm_prob", "renorm.py:33-35"),
    ("sglang.kernels.ops.sampling.renorm", "top_p_renorm_prob", "renorm.py:33-35"),
]:
    register_host_change(
        HostChange(
            name=f"cpu-{_name.replace('_', '-')}",
            target=f"{_module}.{_name}",
            hook_type="bind",
            hook=None,  # cpu/sampling.py: the function of the same name
            why=_SAMPLING_WHY.format(name=_name, where=_where),
            patch=_SAMPLING_PATCH,
            when=_cpu_only,
        )
    )
del _module, _name, _where


def _verify_uses_greedy_hook() -> Callable:
    def verify_uses_greedy_on_cpu(original: Callable, **flags: bool) -> bool:
        # With the entries above CPU has the target-only sampler; only rejection sampling (a
        # Triton kernel, reject_sampling.py) has no CPU version, so that alone keeps CPU greedy.
        flags["is_cpu"] = flags["is_cpu"] and flags["use_rejection_sampling"]
        return original(**flags)

    return verify_uses_greedy_on_cpu


register_host_change(
    HostChange(
        name="cpu-verify-sampling",
        target="sglang.srt.speculative.eagle_utils._verify_uses_greedy",
        hook_type="around",
        hook=_verify_uses_greedy_hook,
        why=(
            "_verify_uses_greedy (sglang/srt/speculative/eagle_utils.py:485-500) returns True for "
            "is_cpu, so eagle_sample (:641) verifies greedily on CPU even for temperature > 0. "
            "With the entries above the sampling branch (:712-785) has its ops on CPU; the hook "
            "drops is_cpu from the predicate unless rejection sampling (Triton only) is on."
        ),
        patch=_SAMPLING_PATCH,
        when=_cpu_only,
    )
)


# --- Server-side SoT on the OpenAI chat route (sglang_specsot/serving/) -----------------------


register_host_change(
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
        when=_http_server_only,
    )
)


# --- Requests that would kill the scheduler, refused with a 400 (serving/request_checks.py) ----


register_host_change(
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
        when=_http_server_only,
    )
)


# --- A bounded cache of deserialized custom logit processors ------------------------------------

PROCESSOR_CACHE_SIZE = 64  # distinct processor strings kept deserialized per process


def _bounded_processor_cache_hook() -> Callable:
    import functools

    from sglang_specsot.host import adapter as sgl

    # SGLang's own deserializer, undecorated, under a bounded cache of the same kind.
    return functools.lru_cache(maxsize=PROCESSOR_CACHE_SIZE)(sgl.uncached_processor_deserializer())


register_host_change(
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


# --- Draft chains on CPU: SGLang's top-k selection run eagerly -------------------------------


def _eager_select_top_k_hook() -> Callable:
    from sglang_specsot.host import adapter as sgl

    return sgl.eager_select_top_k_tokens_later()


register_host_change(
    HostChange(
        name="eager-select-top-k-on-cpu",
        target="sglang.srt.speculative.spec_utils._select_top_k_tokens_later",
        hook_type="replace",
        hook=_eager_select_top_k_hook,
        why=(
            "_select_top_k_tokens_later (sglang/srt/speculative/spec_utils.py:437), which picks "
            "the input of every draft step after the first (EAGLE, STANDALONE, SPECSOT with a "
            "draft model), is torch.compile(dynamic=True) except on NPU and XPU. On CPU there are "
            "no CUDA graphs to capture it at start-up, so the first draft of each server compiles "
            "it with inductor in the middle of serving, seconds of one request's time "
            "(docs/benchmarks.md), for a few-row tensor program that runs eagerly in "
            "microseconds. The replacement is the same function undecorated."
        ),
        patch="eager-select-top-k-on-cpu.diff",
        when=_cpu_only,
    )
)


# --- SPECSOT's cost model and budgets in /server_info (speculative/server_info.py) ----------------


register_host_change(
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


register_host_change(
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


# --- Every server's row-cost curve, measured at start-up and in /server_info (costs/) -----------
# One upstream diff, two entries: the probe once the model is loaded, and its report. Server-side
# SoT prices its answers by the curve (sot/latency.py) on every server, whatever its algorithm.

_ROW_COSTS_PATCH = "row-cost-probe.diff"

register_host_change(
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

register_host_change(
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


# --- The draft model's forwards, for the length of one call (host/adapter.py) ------------------
# Both wrap only the forward of sglang-specsot's own draft model runner, while SGLang's draft
# loop or draft-extend runs; both need the eager CPU draft backend (the draft chain that
# stops early, and the confidence it is priced by), hence CPU only.


def _stoppable_forwards_hook() -> Callable:
    from sglang_specsot.host import adapter as sgl

    return sgl.stoppable_forwards


register_host_change(
    HostChange(
        name="stop-draft-chain-early",
        target="sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft_forward",
        hook_type="scoped",
        hook=_stoppable_forwards_hook,
        why=(
            "EagleDraftWorker.draft_forward (sglang/srt/speculative/eagle_worker_v2.py:816-897) "
            "runs every step of the draft chain and has no way to stop it. SPECSOT stops a chain "
            "where the draft's confidence says the rest would not be accepted: for one draft, "
            "adapter.stoppable_forwards replaces the forward of our draft model runner, and "
            "once told to stop hands SGLang's loop the last forward's output again without a "
            "forward (the tokens it takes past the stop are cut before verify)."
        ),
        patch="draft-forward-step-callback.diff",
        when=_cpu_only,
    )
)


def _kept_forward_logits_hook() -> Callable:
    from sglang_specsot.host import adapter as sgl

    return sgl.kept_forward_logits


register_host_change(
    HostChange(
        name="keep-draft-extend-logits",
        target="sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode",
        hook_type="scoped",
        hook=_kept_forward_logits_hook,
        why=(
            "EagleDraftWorker's draft-extend (sglang/srt/speculative/eagle_worker_v2.py:1207-1272 "
            "after verify, :1062 after prefill) keeps its logits local: for a top-1 chain it "
            "takes the argmax and leaves topk_p = 1.0, so the draft model's confidence in its "
            "next token, which SPECSOT's budget policy prices a chain by, is lost. For one "
            "draft-extend, adapter.kept_forward_logits wraps the forward of our draft model "
            "runner to keep each forward's logits_output."
        ),
        patch="draft-extend-keep-logits.diff",
        when=_cpu_only,
    )
)
