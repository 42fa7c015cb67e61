"""The adapter is the one place that uses SGLang's non-public names, and they all still exist.

Fails loudly on the next SGLang when a name the adapter imports disappears or moves, when a
private method it calls or overrides is gone or takes other parameters, and when any other
module of sglang_specsot uses a private SGLang name (a leading underscore, or a module that is
not SGLang's public API) instead of going through the adapter.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

import sglang_specsot
from sglang_specsot.host import BOUNDARY_EXEMPT, adapter

PACKAGE = Path(sglang_specsot.__file__).parent
ADAPTER = PACKAGE / "host" / "adapter.py"


def _adapter_parts() -> dict[str, Path]:
    """The adapter and the host/ modules it re-exports (dotted name -> file): one adapter in
    several files, each an idea of its own."""
    parts = {"sglang_specsot.host.adapter": ADAPTER}
    for node in ast.parse(ADAPTER.read_text()).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang_specsot.host."):
            parts[node.module] = PACKAGE.parent / (node.module.replace(".", "/") + ".py")
    return parts


ADAPTER_PARTS = _adapter_parts()

# SGLang modules a plugin may import directly: its plugin and registration API.
PUBLIC_MODULES = {
    "sglang": "the frontend language (sgl.function, gen, fork, RuntimeEndpoint)",
    "sglang.srt.plugins.hook_registry": "HookRegistry, SGLang's plugin API",
    "sglang.srt.speculative.spec_registry": "CustomSpecAlgo, the base of a registered algorithm",
    "sglang.srt.speculative.spec_info": "SpeculativeAlgorithm.register",
    "sglang.srt.layers.attention.attention_registry": "register_attention_backend",
    "sglang.srt.sampling.custom_logit_processor": "CustomLogitProcessor, the documented processor API",
}
# Modules that may use SGLang internals without the adapter, and why: the CPU attention
# kernels' exemptions are listed once, in sglang_specsot/host/__init__.py.
EXEMPT = {
    **{path.relative_to(PACKAGE).as_posix(): "the adapter itself" for path in ADAPTER_PARTS.values()},
    "_bootstrap.py": "supplies sgl_kernel before SGLang is imported (patches/README.md ledger)",
    **BOUNDARY_EXEMPT,
}
# Private SGLang names still used outside the adapter, each to move behind it:
# (module, name) -> what to use instead. A stale entry fails test_the_allow_list_is_current.
NOT_YET_MOVED: dict[tuple[str, str], str] = {}  # uses not yet behind the adapter: none


# -- every name the adapter relies on exists ---------------------------------------------------


@pytest.mark.parametrize("name", adapter.__all__)
def test_every_adapter_name_resolves(name):
    assert getattr(adapter, name) is not None


@pytest.mark.parametrize(
    ("owner", "methods"), list(adapter.PRIVATE_METHODS.items()), ids=[c for _, c in adapter.PRIVATE_METHODS]
)
def test_private_methods_exist_with_their_parameters(owner, methods):
    cls = getattr(importlib.import_module(owner[0]), owner[1])
    for name, params in methods.items():
        assert callable(getattr(cls, name, None)), f"SGLang's {owner[1]} has no method {name} any more"
        found = tuple(inspect.signature(getattr(cls, name)).parameters)
        assert found == params, f"{owner[1]}.{name} takes {found} now, the adapter was written for {params}"


@pytest.mark.parametrize(("owner", "names"), list(adapter.INSTANCE_ATTRIBUTES.items()))
def test_instance_attributes_are_still_set_by_sglang(owner, names):
    source = inspect.getsource(getattr(importlib.import_module(owner[0]), owner[1]))
    for name in names:
        assert re.search(rf"self\.{name}\s*[:=]", source), f"{owner[1]} no longer sets self.{name}"


def test_the_adapter_declares_every_private_name_it_uses():
    declared = {m for methods in adapter.PRIVATE_METHODS.values() for m in methods}
    declared |= {f for fields in adapter.PRIVATE_FIELDS.values() for f in fields}
    ours = {name for module in ADAPTER_PARTS for name in vars(importlib.import_module(module))}
    used = {name for path in ADAPTER_PARTS.values() for name, _ in _private_uses(ast.parse(path.read_text()))}
    assert {name for name in used if name not in ours} == declared


@pytest.mark.parametrize(("owner", "fields"), list(adapter.PRIVATE_FIELDS.items()))
def test_private_fields_are_what_sglangs_properties_read(owner, fields):
    cls = getattr(importlib.import_module(owner[0]), owner[1])
    for field, prop in fields.items():
        assert f"self.{field}" in inspect.getsource(vars(cls)[prop].fget), (owner, prop, field)


def test_spec_worker_base_binds_the_workers_sglang_reads():
    worker = adapter.SpecWorkerBase.__new__(adapter.SpecWorkerBase)
    target, draft = object(), object()
    worker.bind_workers(target, draft)
    assert worker.target_worker is target and worker.draft_worker is draft
    worker.bind_workers(target)
    assert worker.draft_worker is None


def test_the_adapters_parts_are_found():
    assert len(ADAPTER_PARTS) >= 4 and all(path.is_file() for path in ADAPTER_PARTS.values()), ADAPTER_PARTS


def test_every_lazy_import_in_the_adapter_resolves():
    nodes = [node for path in ADAPTER_PARTS.values() for node in ast.walk(ast.parse(path.read_text()))]
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang."):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{node.module} has no {alias.name}"


def test_adapter_subclasses_route_private_methods_to_public_ones():
    assert issubclass(adapter.DraftModelWorker, _sglang("standalone_worker_v2", "StandaloneDraftWorker"))
    assert issubclass(adapter.EagleHeadWorker, _sglang("eagle_worker_v2", "EagleDraftWorker"))
    assert not issubclass(adapter.EagleHeadWorker, _sglang("standalone_worker_v2", "StandaloneDraftWorker"))
    for cls, private, public in [
        (adapter.EagleHeadWorker, "_rebuild_topk1_chain_buffers", "rebuild_chain_buffers"),
        (adapter.TaggingRuntimeEndpoint, "_add_images", "extend_generate_body"),
        (adapter.DraftModelWorker, "_rebuild_topk1_chain_buffers", "rebuild_chain_buffers"),
        (adapter.FutureMapBase, "_resolve_spec_extras", "resolve_spec_extras"),
    ]:
        assert public in inspect.getsource(vars(cls)[private]), (cls, private)


def test_tagging_endpoint_extends_every_generate_body():
    seen = []

    class Endpoint(adapter.TaggingRuntimeEndpoint):
        def __init__(self):  # no server: only the body hook is exercised
            pass

        def extend_generate_body(self, state, body):
            seen.append((state, dict(body)))
            body["custom"] = 1

    class State:
        images_ = []

    body = {"text": "hi"}
    Endpoint()._add_images(State, body)
    assert seen == [(State, {"text": "hi"})] and body == {"text": "hi", "custom": 1}


def _sglang(module: str, name: str):
    return getattr(importlib.import_module(f"sglang.srt.speculative.{module}"), name)


# -- nothing else uses a private SGLang name ---------------------------------------------------


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "sgl_kernel_shim" not in p.parts)


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_uses(tree: ast.AST):
    """(name, node) of every private attribute used or method defined."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            yield node.attr, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and _is_private(item.name):
                    yield item.name, item


def _sglang_imports(tree: ast.AST):
    """(module, imported name or None) of every import of SGLang."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "sglang" or alias.name.startswith("sglang."):
                    yield alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "sglang" or node.module.startswith("sglang."):
                for alias in node.names:
                    yield node.module, alias.name


def _our_private_names() -> set[str]:
    """Private names sglang_specsot defines itself (functions, classes, attributes it assigns)."""
    names = set()
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if _is_private(n)}


def _sglang_private_names_of(path: Path) -> dict[str, set[str]]:
    """For each top-level class of `path` with SGLang bases: the private names SGLang's part
    of its MRO defines or sets on `self` (inherited state and methods)."""
    tree = ast.parse(path.read_text())
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and n.bases]
    if not classes:
        return {}
    module = importlib.import_module("sglang_specsot." + _rel(path)[:-3].replace("/", "."))
    found = {}
    for name in classes:
        bases = [b for b in getattr(module, name).__mro__ if b.__module__.startswith("sglang.")]
        source = "\n".join(_source_or_empty(b) for b in bases)
        names = {n for b in bases for n in vars(b) if _is_private(n)}
        found[name] = names | set(re.findall(r"self\.(_[A-Za-z]\w*)", source))
    return found


def _source_or_empty(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""


def _violations(path: Path, ours: set[str]) -> set[tuple[str, str]]:
    rel, tree = _rel(path), ast.parse(path.read_text())
    found = set()
    for module, name in _sglang_imports(tree):
        if module not in PUBLIC_MODULES or (name is not None and _is_private(name)):
            found.add((rel, module))
    inherited = _sglang_private_names_of(path)
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for name, _ in _private_uses(cls):
            if name in inherited.get(cls.name, ()):
                found.add((rel, name))  # a private method or attribute of an SGLang base
    for name, node in _private_uses(tree):
        if isinstance(node, ast.Attribute) and name not in ours and not _on_self(node) and not _on_torch(node):
            found.add((rel, name))  # a private name on some other (SGLang) object
    return found


def _on_torch(node: ast.Attribute) -> bool:
    """A name reached from `torch` (e.g. torch.ops.aten._weight_int8pack_mm): torch's, not SGLang's."""
    value = node.value
    while isinstance(value, ast.Attribute):
        value = value.value
    return isinstance(value, ast.Name) and value.id == "torch"


def _on_self(node: ast.Attribute) -> bool:
    value = node.value
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


def _all_violations() -> set[tuple[str, str]]:
    ours = _our_private_names()
    return {v for p in _modules() if _rel(p) not in EXEMPT for v in _violations(p, ours)}


def test_no_module_but_the_adapter_uses_a_private_sglang_name():
    unexpected = _all_violations() - set(NOT_YET_MOVED)
    assert not unexpected, (
        f"these modules use SGLang names that are not its public API: {sorted(unexpected)}; "
        "add the name to sglang_specsot/host/adapter.py and use it from there"
    )


def test_the_allow_list_is_current():
    stale = set(NOT_YET_MOVED) - _all_violations()
    assert not stale, f"NOT_YET_MOVED lists uses that are gone; remove {sorted(stale)}"
    for rel in EXEMPT:
        assert (PACKAGE / rel).is_file(), rel


def test_a_private_name_reached_from_torch_is_torchs_not_sglangs():
    torch_use = ast.parse("torch.ops.aten._weight_int8pack_mm(x, q, s)").body[0].value.func
    sglang_use = ast.parse("batch.spec_info._private(x)").body[0].value.func
    assert _on_torch(torch_use) and not _on_torch(sglang_use)
