"""The host-change ledger (sglang_specsot/host/changes.py): every entry's SGLang target exists,
each entry implemented outside the boundary gets its hook from the plugin's wiring, and the
changes made outside HookRegistry ("environ", "scoped") are made as the ledger says."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pkgutil

import pytest

from sglang_specsot.cpu.threads import keep_workers_spinning
from sglang_specsot.host import adapter, changes, draft_forwards
from sglang_specsot.host.changes import HOST_CHANGES, apply_host_changes
from sglang_specsot.wiring import HOST_CHANGE_HOOKS

SCOPED = [c for c in HOST_CHANGES if c.hook_type == "scoped"]


@pytest.fixture
def only(monkeypatch):
    """Apply just the given entries, in a process where none was applied yet."""
    monkeypatch.setattr(changes, "_applied", [])

    def use(*entries):
        monkeypatch.setattr(changes, "HOST_CHANGES", [dataclasses.replace(c, when=lambda: True) for c in entries])

    return use


@pytest.mark.parametrize("change", [c for c in HOST_CHANGES if c.hook_type != "environ"], ids=lambda c: c.name)
def test_every_target_exists_in_this_sglang(change):
    owner, attr = change.target.rsplit(".", 1)
    assert hasattr(pkgutil.resolve_name(owner), attr), f"SGLang has no {change.target} (is this 0.5.23?)"


def test_the_wiring_supplies_exactly_the_hooks_the_ledger_leaves_out():
    assert set(HOST_CHANGE_HOOKS) == {c.name for c in HOST_CHANGES if c.hook is None}
    with pytest.raises(AssertionError, match=r"missing \['sot-chat-route'\]"):
        apply_host_changes({k: v for k, v in HOST_CHANGE_HOOKS.items() if k != "sot-chat-route"})


def test_the_spin_count_is_an_environment_change_on_cpu_only(only):
    change = next(c for c in HOST_CHANGES if c.name == "omp-spin-on-cpu")
    assert (change.hook_type, change.target, change.when) == ("environ", "GOMP_SPINCOUNT", changes.cpu_only)
    assert HOST_CHANGE_HOOKS[change.name]() is keep_workers_spinning  # tested in tests/unit/cpu/
    calls = []
    only(dataclasses.replace(change, hook=lambda: lambda: calls.append("set")))
    assert apply_host_changes({}) == [change.name] and calls == ["set"]
    assert apply_host_changes({}) == [change.name] and calls == ["set"]  # once per process


def test_the_scoped_changes_are_the_adapters_forward_swaps():
    hooks = {c.name: c.hook() for c in SCOPED}
    assert hooks == {"stop-draft-chain-early": adapter.stoppable_forwards,
                     "keep-draft-extend-logits": adapter.kept_forward_logits}  # fmt: skip
    # No other function of the boundary swaps a forward: each swap is in the ledger.
    tree = ast.Module([*ast.parse(inspect.getsource(adapter)).body, *ast.parse(inspect.getsource(draft_forwards)).body], [])
    swapping = {
        fn.name for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and fn.name != "_forward_replaced"
        and any(isinstance(n, ast.Name) and n.id == "_forward_replaced" for n in ast.walk(fn))
    }  # fmt: skip
    assert swapping == {f.__name__ for f in hooks.values()}


def test_applying_a_scoped_change_changes_nothing_in_sglang(only):
    from sglang.srt.plugins.hook_registry import HookRegistry

    only(*SCOPED)
    assert apply_host_changes({}) == [c.name for c in SCOPED]
    assert not {c.target for c in SCOPED} & set(HookRegistry._hooks)
