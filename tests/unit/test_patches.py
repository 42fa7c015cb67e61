"""Every upstream-ready diff in patches/ applies cleanly to the installed SGLang 0.5.23."""

from __future__ import annotations

import os
import py_compile
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import sglang

from sglang_specsot.host.changes import HOST_CHANGES

PATCH_DIR = Path(__file__).resolve().parents[2] / "patches"
SITE = Path(sglang.__file__).resolve().parents[1]  # the directory that holds `sglang/`
DIFFS = sorted(PATCH_DIR.glob("*.diff"))


def _touched_files(diff: str) -> list[str]:
    # Upstream paths: a/python/sglang/... ; the wheel has sglang/... (strip two components).
    return sorted(set(re.findall(r"^\+\+\+ b/python/(sglang/\S+)", diff, flags=re.M)))


def test_there_are_patches_for_the_host_changes():
    assert {c.patch for c in HOST_CHANGES} <= {d.name for d in DIFFS}
    assert DIFFS, "patches/ has no diffs"


@pytest.mark.parametrize("diff_path", DIFFS, ids=[d.name for d in DIFFS])
def test_patch_applies_to_sglang_0_5_23(diff_path, tmp_path):
    diff = diff_path.read_text()
    files = _touched_files(diff)
    assert files, f"{diff_path.name} touches no python/sglang/ file"
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SITE / rel, tmp_path / rel)
    # tmp_path is outside any git work tree, so `git apply` acts as a strict patch tool.
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tmp_path.parent))
    subprocess.run(
        ["git", "apply", "-p2", "--whitespace=nowarn", str(diff_path)],
        cwd=tmp_path, check=True, env=env, capture_output=True, text=True,
    )  # fmt: skip
    for rel in files:
        assert (tmp_path / rel).read_text() != (SITE / rel).read_text(), rel
        py_compile.compile(str(tmp_path / rel), doraise=True)
