"""The saved SPECSOT states the ceiling tools read, in every shape the benchmark folders keep."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from sglang_specsot.bench.ceiling import specsot_part

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("speculation_ceiling", ROOT / "examples" / "speculation_ceiling.py")
ceiling = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ceiling)

STATE = {"cost_model": {"target": {"probe_rows": [1, 4], "probe_ms": [10.0, 20.0], "overhead_ms": 0.1}}}


@pytest.mark.parametrize("doc", [
    {"speculative_num_draft_tokens": 6, "internal_states": [{"specsot": STATE}]},  # a whole /server_info
    {"speculative_num_draft_tokens": 6, "specsot": STATE},  # bench_speculative's specsot-state, a server_state line
    STATE,  # trimmed by hand to SPECSOT's part
], ids=["server_info", "specsot-key", "bare"])  # fmt: skip
def test_each_shape_gives_specsots_part(doc):
    assert specsot_part(doc) == STATE


def test_what_is_no_specsot_state_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="is it a SPECSOT server"):
        specsot_part({"internal_states": [{"last_gen_throughput": 1.0}]})
    with pytest.raises(ValueError, match="no internal_states, specsot or cost_model key"):
        specsot_part({"model_path": "m"})


def test_the_ceiling_tool_reads_a_recorded_trimmed_state(tmp_path):
    # A benchmark folder's specsot-state-*.json holds SPECSOT's part alone: no verify window.
    (recorded,) = (ROOT / "benchmarks").glob("bench-speculative-never-drafts-bracketed-*/specsot-state-SPECSOT.json")
    info = ceiling.load(None, str(recorded))
    assert info["verify_width"] is None and ceiling.cost_model(info).draft is not None
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"speculative_num_draft_tokens": 6, "specsot": json.loads(recorded.read_text())}))
    assert ceiling.load(None, str(path))["verify_width"] == 6
