"""Every change sglang-specsot makes to SGLang's behaviour, in one ordered list.

Each entry is applied through SGLang's own `HookRegistry` (sglang/srt/plugins/hook_registry.py),
names the SGLang file:line it changes, says why no public seam served, and has the same
change as an upstream-ready diff against sglang 0.5.23 in `patches/` (checked by
tests/unit/test_patches.py). Entries whose `when` is false in this process are skipped: most
apply on SGLang's CPU path only, the chat route and the request checks in the HTTP server's
process only. The entries are built in cpu_changes.py (SGLang's CPU path) and
server_changes.py (every server), what an entry is in host_change.py; the list, in the order
applied, and its application are here.

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
import pkgutil
import sys
from collections.abc import Callable, Mapping
from types import MappingProxyType

from sglang_specsot.host.cpu_changes import CPU_CHANGES
from sglang_specsot.host.host_change import HostChange, cpu_only, http_server_only
from sglang_specsot.host.server_changes import SERVER_CHANGES

logger = logging.getLogger(__name__)


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


for _change in [*CPU_CHANGES, *SERVER_CHANGES]:
    register_host_change(_change)
del _change

__all__ = ["HOST_CHANGES", "HostChange", "applied_host_changes", "apply_host_changes", "cpu_only",
           "http_server_only", "register_host_change"]  # fmt: skip
