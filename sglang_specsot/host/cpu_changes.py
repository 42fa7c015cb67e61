"""The host changes SGLang's CPU path needs (each `when=cpu_only`), in the order applied.

Entries of the one ledger, host/changes.py, which applies them before the changes every
server takes (server_changes.py); read that module for what an entry is and how each hook
type is applied. Within this list, order matters where said (the sampling binds before the
verify that uses them).
"""

from __future__ import annotations

from collections.abc import Callable

from sglang_specsot.host.host_change import HostChange, cpu_only

CPU_CHANGES: list[HostChange] = []


# --- CPU: OpenMP workers kept awake between a step's ops (sglang_specsot/cpu/threads.py) -------


CPU_CHANGES.append(
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
        when=cpu_only,
    )
)


CPU_CHANGES.append(
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
        when=cpu_only,
    )
)


# --- Linear weights in oneDNN's packed layout where faster (sglang_specsot/cpu/packed_linear.py) -


CPU_CHANGES.append(
    HostChange(
        name="cpu-packed-linear-weights",
        target="sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.process_weights_after_loading",
        hook_type="after",
        hook=None,  # cpu/packed_linear.py: pack_after_loading
        why=(
            "UnquantizedLinearMethod lays a CPU layer's weight out for its kernel only where "
            "sgl-kernel's CPU build and AMX are present (layers/quantization/unquant.py:569, "
            "_amx_process_weight_after_loading); elsewhere apply multiplies the loaded row-major "
            "weight with F.linear (:572-620), which oneDNN's bf16 kernels do not read at memory "
            "speed: on the 2-core AVX-512 EPYC the 1.5B's 8960x1536 product took 1.4 ms at 1 row "
            "against 0.75 ms packed. After each layer's weights are loaded the hook replaces a "
            "bf16 weight with torch's oneDNN packed layout where a start-up timing measured it "
            "faster at every row count, and switches the layer's method to a subclass whose "
            "apply multiplies it with oneDNN's packed op."
        ),
        patch="cpu-packed-linear-weights.diff",
        when=cpu_only,
    )
)


# --- Attention entries: the `specsot_cpu` backend (sglang_specsot/cpu/attention.py) ------------


CPU_CHANGES.append(
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
        when=cpu_only,
    )
)


def _last_loc_hook() -> Callable:
    from sglang_specsot.host.adapter import get_last_loc_torch

    return get_last_loc_torch


CPU_CHANGES.append(
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
        when=cpu_only,
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
    CPU_CHANGES.append(
        HostChange(
            name=f"cpu-{_name.replace('_', '-')}",
            target=f"{_module}.{_name}",
            hook_type="bind",
            hook=None,  # cpu/sampling.py: the function of the same name
            why=_SAMPLING_WHY.format(name=_name, where=_where),
            patch=_SAMPLING_PATCH,
            when=cpu_only,
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


CPU_CHANGES.append(
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
        when=cpu_only,
    )
)


# --- Draft chains on CPU: SGLang's top-k selection run eagerly -------------------------------


def _eager_select_top_k_hook() -> Callable:
    from sglang_specsot.host import adapter as sgl

    return sgl.eager_select_top_k_tokens_later()


CPU_CHANGES.append(
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
        when=cpu_only,
    )
)


# --- The draft model's forwards, for the length of one call (host/adapter.py) ------------------
# Both wrap only the forward of sglang-specsot's own draft model runner, while SGLang's draft
# loop or draft-extend runs; both need the eager CPU draft backend (the draft chain that
# stops early, and the confidence it is priced by), hence CPU only.


def _stoppable_forwards_hook() -> Callable:
    from sglang_specsot.host import adapter as sgl

    return sgl.stoppable_forwards


CPU_CHANGES.append(
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
        when=cpu_only,
    )
)


def _kept_forward_logits_hook() -> Callable:
    from sglang_specsot.host import adapter as sgl

    return sgl.kept_forward_logits


CPU_CHANGES.append(
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
        when=cpu_only,
    )
)
