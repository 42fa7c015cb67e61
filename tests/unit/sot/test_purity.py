"""The SoT core is plain Python: importing it pulls in neither SGLang, torch nor transformers."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import sglang_specsot.sot

FORBIDDEN = ("sglang", "torch", "transformers")
SOT_DIR = Path(sglang_specsot.sot.__file__).parent


def test_importing_every_sot_module_loads_no_heavy_dependency():
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import sglang_specsot.sot as sot\n"
        "for m in pkgutil.iter_modules(sot.__path__):\n"
        "    importlib.import_module(f'sglang_specsot.sot.{m.name}')\n"
        f"print(json.dumps(sorted(k for k in sys.modules if k.split('.')[0] in {FORBIDDEN!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_no_sot_source_imports_a_heavy_dependency_even_lazily():
    files = sorted(SOT_DIR.glob("*.py"))
    assert len(files) >= 6
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"
                if name.startswith("sglang_specsot"):
                    assert name.startswith("sglang_specsot.sot"), f"{path.name} imports {name}"


def test_library_code_never_prints():
    for path in SOT_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "print", f"{path.name} prints; log instead"
