"""Every module that claims to be plain Python is: importing it pulls in neither SGLang, torch
nor transformers, its source imports none of them even lazily (a command's
`if __name__ == "__main__":` block excepted: importing never runs it), and it never prints."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import sglang_specsot

FORBIDDEN = ("sglang", "torch", "transformers")
PACKAGE_DIR = Path(sglang_specsot.__file__).parent
SOT_MODULES = sorted(f"sglang_specsot.sot.{m.name}" for m in pkgutil.iter_modules([str(PACKAGE_DIR / "sot")]))
# The pure parts of speculative/ (the drafter's tree shape, the SoT-context drafter, the
# budget policy), and the cost model it reads and the curve it publishes (costs/).
SPECULATIVE_MODULES = [
    "sglang_specsot.speculative.context_draft",
    "sglang_specsot.speculative.draft_tree",
    "sglang_specsot.costs.cost_model",
    "sglang_specsot.costs.published",
    "sglang_specsot.speculative.policy",
    *sorted(
        f"sglang_specsot.speculative.policy.{m.name}"
        for m in pkgutil.iter_modules([str(PACKAGE_DIR / "speculative" / "policy")])
    ),
    "sglang_specsot.speculative.shadow",
    "sglang_specsot.speculative.trace",
    "sglang_specsot.speculative.jsonl",
    "sglang_specsot.speculative.replay",
]
# The question sets' loader: json and pathlib only, so the eval commands can read sets.
DATA_MODULES = ["sglang_specsot.data"]
PURE_MODULES = SOT_MODULES + SPECULATIVE_MODULES + DATA_MODULES
# What a pure module may import from this package: other pure modules (and packages' __init__).
PURE_PACKAGES = ("sglang_specsot.sot", *SPECULATIVE_MODULES, *DATA_MODULES)


def _source(module: str) -> Path:
    path = PACKAGE_DIR.parent / module.replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def test_the_pure_set_is_what_it_claims():
    assert len(SOT_MODULES) >= 10 and "sglang_specsot.sot.runner" in SOT_MODULES
    assert "sglang_specsot.sot.tag" in SOT_MODULES and "sglang_specsot.sot.phases" in SOT_MODULES


@pytest.mark.parametrize("module", PURE_MODULES)
def test_importing_loads_no_heavy_dependency(module):
    code = (
        f"import importlib, json, sys\nimportlib.import_module({module!r})\n"
        f"print(json.dumps(sorted(k for k in sys.modules if k.split('.')[0] in {FORBIDDEN!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def _library_nodes(tree: ast.Module):
    """Every node but those under a top-level `if __name__ == "__main__":`."""
    for top in tree.body:
        if not _is_main_block(top):
            yield from ast.walk(top)


def _is_main_block(node: ast.stmt) -> bool:
    test = getattr(node, "test", None)
    return (isinstance(node, ast.If) and isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))  # fmt: skip


@pytest.mark.parametrize("module", PURE_MODULES)
def test_source_imports_no_heavy_dependency_even_lazily(module):
    path = _source(module)
    for node in _library_nodes(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"
            if name.startswith("sglang_specsot"):
                assert name.startswith(PURE_PACKAGES), f"{path.name} imports {name}, which is not pure"


@pytest.mark.parametrize("module", PURE_MODULES)
def test_library_code_never_prints(module):
    path = _source(module)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id != "print", f"{path.name} prints; log instead"


def test_only_the_main_block_is_exempt():
    tree = ast.parse(
        "import json\ndef f():\n    import torch\nif __name__ == '__main__':\n    import sglang\n"
    )
    imported = {a.name for n in _library_nodes(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported == {"json", "torch"}
