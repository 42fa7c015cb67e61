"""Every change sglang-specsot makes to SGLang's behaviour, in one ordered list.

Each entry is applied through SGLang's own `HookRegistry` (sglang/srt/plugins/hook_registry.py),
names the SGLang file:line it changes, says why no public seam served, and has the same
change as an upstream-ready diff against sglang 0.5.23 in `patches/` (checked by
tests/unit/test_patches.py). Entries whose `when` is false in this process are skipped.

`HookRegistry.apply_hooks` logs and swallows failures, so `apply_host_changes` re-checks
that every applied target is really wrapped and raises otherwise.
"""

from __future__ import annotations

import logging
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostChange:
    """One change to SGLang: a HookRegistry hook on `target`, with its reason and patch."""

    name: str
    target: str  # dotted path, as HookRegistry.register takes it
    hook_type: str  # "before" | "after" | "around" | "replace"
    hook: Callable[[], Callable]  # returns the hook callable (lazy: may import torch/SGLang)
    why: str  # what SGLang does at file:line and why no public seam served
    patch: str  # file name under patches/
    when: Callable[[], bool] = field(default=lambda: True)


def _cpu_only() -> bool:
    from sglang_specsot._bootstrap import cpu_engine_requested

    return cpu_engine_requested()


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


def apply_host_changes() -> list[str]:
    """Register every applicable change with HookRegistry, apply, and verify. Idempotent."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    pending = [c for c in HOST_CHANGES if c.name not in _applied and c.when()]
    originals = {}
    for change in pending:
        originals[change.name] = _resolve(change.target)
        HookRegistry.register(change.target, change.hook(), HookType(change.hook_type))
    HookRegistry.apply_hooks()
    for change in pending:
        if _resolve(change.target) is originals[change.name]:
            raise RuntimeError(
                f"sglang-specsot host change {change.name!r} was not applied to {change.target}; "
                "see the HookRegistry error logged above (is this SGLang 0.5.23?)"
            )
        _applied.append(change.name)
        logger.info("sglang-specsot: applied host change %s -> %s", change.name, change.target)
    return applied_host_changes()


# --- Attention entries: the `specsot_cpu` backend (sglang_specsot/cpu/attention.py) ------------


def _draft_backend_factory_hook() -> Callable:
    from sglang_specsot.cpu.draft_attention import draft_backend_factory_around

    return draft_backend_factory_around


register_host_change(
    HostChange(
        name="draft-backend-factory-specsot-cpu",
        target="sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend",
        hook_type="around",
        hook=_draft_backend_factory_hook,
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
    from sglang.srt.mem_cache.allocation import get_last_loc_torch

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
