"""The package's import graph: no cycle between packages nor between modules, one SGLang
boundary, a pure SoT core, and no module too long to read.

Every module under sglang_specsot/ is parsed with `ast`; nothing is imported. The graph is
drawn twice: between first-level subpackages (`sot`, `speculative`, ...) and top-level
modules (`plugin`, `frontend`, ...), and between dotted modules. An edge is any import, lazy
ones inside functions and `TYPE_CHECKING` ones included: a cycle hidden in a function is
still two modules that cannot be read, tested or moved apart. `from pkg import name` is an
edge to the module `pkg.name` where there is one, else to `pkg` itself (its `__init__`).
A module's `if __name__ == "__main__":` block is the command `python -m` runs, not the
module: importing never runs it and nothing can import it, so its imports are the edges of a
node of its own ("sot.router (command)"), which may reach anything and can close no cycle.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

import sglang_specsot
from sglang_specsot.host import BOUNDARY_EXEMPT

PACKAGE = Path(sglang_specsot.__file__).parent
BOUNDARY = "host"  # the one package that names SGLang's internals (sglang_specsot/host/)
HEAVY = ("torch", "sglang", "transformers")  # what the SoT core never imports
MAX_LINES = 450  # a module longer than this holds more than one idea: split it by idea
SCRIPTS = PACKAGE.parent / "scripts"


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (the sgl_kernel shim is a stand-in
    for another distribution, not part of this one)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        if "sgl_kernel_shim" not in parts:
            found[".".join(parts)] = path
    return found


def _node(module: str) -> str:
    """The graph node of a dotted module name: its first-level package or top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(package)"


def _is_main_block(stmt: ast.stmt) -> bool:
    test = getattr(stmt, "test", None)
    return (isinstance(stmt, ast.If) and isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))  # fmt: skip


def _imports(module: str, path: Path):
    """(imported dotted name, line, whether in the command block) of every import."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for top in tree.body:
        command = _is_main_block(top)
        for node in ast.walk(top):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield alias.name, node.lineno, command
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: level 1 is this module's package
                    parts = package.split(".")
                    base = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [node.module])])
                if base.split(".")[0] != "sglang_specsot":
                    yield base, node.lineno, command
                    continue
                for alias in node.names:  # a submodule, or a name of `base` (Graph resolves it)
                    yield f"{base}.{alias.name}", node.lineno, command


def _strongly_connected(edges) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    graph = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _explain(edges, component: list[str]) -> list[str]:
    return [f"{a} -> {b}: {'; '.join(why)}" for (a, b), why in sorted(edges.items())
            if a in component and b in component]  # fmt: skip


class Graph:
    """Package-level and module-level edges of sglang_specsot, each with the imports that
    make it."""

    def __init__(self) -> None:
        self.modules = _modules()
        nodes = {_node(m) for m in self.modules}
        self.edges: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.module_edges: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.sglang: list[tuple[str, str]] = []  # (module, SGLang module) below `sglang`
        self.heavy: dict[str, list[str]] = defaultdict(list)  # node -> heavy imports in it
        for module, path in self.modules.items():
            for name, line, command in _imports(module, path):
                where = f"{path.relative_to(PACKAGE).as_posix()}:{line}"
                source = _node(module) + (f" ({module.split('.', 1)[1]} command)" if command else "")
                root = name.split(".")[0]
                if root in HEAVY:
                    self.heavy[source].append(f"{where} {name}")
                if root == "sglang" and name != "sglang":
                    self.sglang.append((module, f"{where} {name}"))
                if root == "sglang_specsot" and "." in name:
                    target = _node(name)
                    if target in nodes and target != _node(module):
                        self.edges[(source, target)].append(f"{where} {name}")
                    imported = self.resolve(name)
                    if imported is not None and imported != module:
                        origin = module + (" (command)" if command else "")
                        self.module_edges[(origin, imported)].append(f"{where} {name}")

    def resolve(self, name: str) -> str | None:
        """The module an imported dotted name lives in: itself, or the nearest package or
        module above it (`pkg.mod.Class` -> `pkg.mod`)."""
        while name and name not in self.modules:
            name = name.rpartition(".")[0]
        return name or None

    def rel(self, module: str) -> str:
        """A module's path under sglang_specsot/, as host/__init__.py lists exemptions."""
        return self.modules[module].relative_to(PACKAGE).as_posix()

    def reach(self, start: str) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            node = todo.pop()
            for (a, b) in self.edges:
                if a == node and b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen

    def cycles(self) -> list[list[str]]:
        """The package cycles: strongly connected components of more than one node."""
        return _strongly_connected(self.edges)

    def module_cycles(self) -> list[list[str]]:
        return _strongly_connected(self.module_edges)

    def explain(self, component: list[str]) -> list[str]:
        return _explain(self.edges, component)

    def explain_modules(self, component: list[str]) -> list[str]:
        return _explain(self.module_edges, component)


@pytest.fixture(scope="module")
def graph() -> Graph:
    return Graph()


def test_there_is_no_cycle_between_packages(graph):
    cycles = graph.cycles()
    assert not cycles, "package cycles:\n" + "\n".join(line for c in cycles for line in graph.explain(c))


def test_there_is_no_cycle_between_modules(graph):
    cycles = graph.module_cycles()
    assert not cycles, "module cycles:\n" + "\n\n".join("\n".join(graph.explain_modules(c)) for c in cycles)


def test_no_module_is_longer_than_the_limit():
    """Files under about 400 lines (docs/style.md): past MAX_LINES a module holds two ideas."""
    files = [*PACKAGE.rglob("*.py"), *SCRIPTS.rglob("*.py")]
    long = {p.relative_to(PACKAGE.parent).as_posix(): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert len(files) > 100 and not long, f"modules over {MAX_LINES} lines (split them by idea): {long}"


def test_only_the_boundary_imports_sglangs_modules(graph):
    """`import sglang` (the frontend language) is public; every module below it is reached
    through sglang_specsot/host/, but for the exemptions listed in host/__init__.py."""
    outside = [
        where for module, where in graph.sglang
        if _node(module) != BOUNDARY and graph.rel(module) not in BOUNDARY_EXEMPT
    ]  # fmt: skip
    assert not outside, f"SGLang imported outside sglang_specsot/{BOUNDARY}/: {outside}"


def test_the_exemptions_are_current(graph):
    importers = {graph.rel(module) for module, _ in graph.sglang}
    for rel, why in BOUNDARY_EXEMPT.items():
        assert rel in importers, f"{rel} imports no SGLang module any more: drop its exemption"
        assert len(why) > 20, rel


def test_the_sot_core_imports_neither_models_nor_torch(graph):
    reached = graph.reach("sot")
    assert "models" not in reached, graph.explain(sorted(reached))
    heavy = {node: graph.heavy[node] for node in reached if graph.heavy.get(node)}
    assert not heavy, f"the SoT core reaches {heavy}"


def test_every_module_is_parsed_and_the_graph_is_not_empty(graph):
    assert {"sglang_specsot.sot.router", "sglang_specsot.host.adapter", "sglang_specsot.plugin"} <= set(graph.modules)
    assert {("speculative", BOUNDARY), ("plugin", "wiring"), ("wiring", "cpu")} <= set(graph.edges)
    # `from pkg import module` reaches the module; `from module import name` the module.
    assert ("sglang_specsot.speculative.drafters.model", "sglang_specsot.speculative.vocab") in graph.module_edges
    assert ("sglang_specsot.sot.router", "sglang_specsot.sot.config") in graph.module_edges
    assert graph.resolve("sglang_specsot.sot.router.route_question") == "sglang_specsot.sot.router"


def test_a_command_block_is_a_node_of_its_own():
    tree = ast.parse("import json\nif __name__ == '__main__':\n    import torch\n")
    assert [_is_main_block(s) for s in tree.body] == [False, True]


def test_the_cycle_finder_names_every_edge_of_a_cycle(graph, monkeypatch):
    monkeypatch.setattr(graph, "edges", {("a", "b"): ["a.py:1"], ("b", "c"): ["b.py:2"], ("c", "a"): ["c.py:3"],
                                         ("c", "d"): ["c.py:4"]})  # fmt: skip
    assert graph.cycles() == [["a", "b", "c"]]
    assert graph.explain(["a", "b", "c"]) == ["a -> b: a.py:1", "b -> c: b.py:2", "c -> a: c.py:3"]
