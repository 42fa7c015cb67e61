"""examples/cpu_paths.py: each path's environment, the summary's ratios, bad arguments refused."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[3] / "examples" / "cpu_paths.py"
_spec = importlib.util.spec_from_file_location("cpu_paths", _PATH)
cp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cp)


def test_each_path_sets_only_what_makes_it_that_path():
    assert cp.PATHS["packed"] == {}
    assert cp.PATHS["loaded"] == {"SGLANG_SPECSOT_PACKED_LINEAR": "off"}
    assert cp.PATHS["avx2"] == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def test_the_summary_gives_medians_and_ratios_to_the_fastest_at_each_row_count():
    records = [
        {"path": "packed", "rows": 1, "ms_per_step": ms} for ms in (120.0, 121.0, 500.0)
    ] + [{"path": "avx2", "rows": 1, "ms_per_step": ms} for ms in (128.0, 130.0, 126.0)] + [
        {"path": "packed", "rows": 5, "ms_per_step": 175.0}, {"path": "avx2", "rows": 5, "ms_per_step": 661.0},
    ]  # fmt: skip
    one, five = cp.summary(records)
    assert one == "1 row(s): avx2 128.0 ms/step (1.06x the fastest), packed 121.0 ms/step (1.00x the fastest)"
    assert five.startswith("5 row(s): avx2 661.0 ms/step (3.78x the fastest), packed 175.0")


def test_an_unknown_path_is_refused_naming_the_choices(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "argv", ["cpu_paths.py", "--paths", "packed,fast", "--out", str(tmp_path / "r.jsonl")])
    with pytest.raises(SystemExit):
        cp.main()
    assert "unknown ['fast']; choose from packed, loaded, avx2" in capsys.readouterr().err
