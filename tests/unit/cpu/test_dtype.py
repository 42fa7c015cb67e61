"""A CPU launch with --dtype auto runs the dtype a start-up timing measures faster, and says so.

The pure decision and its inputs first, then SGLang's real argument resolution (in the
CPU-engine subprocess the unit tests share) with the plugin loaded as a launch loads it and the
timing replaced, so that both outcomes are seen on any machine.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_specsot.costs import dtype_choice
from sglang_specsot.costs.dtype_choice import FLOAT32, MARGIN, choose_dtype, half_dtype
from sglang_specsot.cpu.dtype import checkpoint_dtype, cpu_dtype_choice, fp32_weight_bytes
from tests.unit import cpu_checks

GIB = 2**30


def test_float32_where_it_is_faster_by_the_margin_and_fits():
    choice = choose_dtype("bfloat16", {"bfloat16": 10.0, FLOAT32: 5.0}, 6 * GIB, 16 * GIB)
    assert choice.dtype == FLOAT32 and choice.changed
    assert "0.50x" in choice.reason and "pass --dtype" in choice.message()


@pytest.mark.parametrize(
    ("ms", "fp32_bytes", "available", "why"),
    [
        ({"bfloat16": 10.0, FLOAT32: 10.0 * MARGIN + 0.1}, 1 * GIB, 16 * GIB, "not faster"),
        ({"bfloat16": 10.0, FLOAT32: 20.0}, 1 * GIB, 16 * GIB, "not faster"),
        ({"bfloat16": 10.0, FLOAT32: 5.0}, 9 * GIB, 16 * GIB, "exceed 50%"),
        ({"bfloat16": 10.0, FLOAT32: 5.0}, None, 16 * GIB, "unknown"),
        ({"bfloat16": 10.0, FLOAT32: 5.0}, 1 * GIB, None, "unknown"),
    ],
)
def test_the_half_dtype_stays_unless_float32_wins_and_fits(ms, fp32_bytes, available, why):
    choice = choose_dtype("bfloat16", ms, fp32_bytes, available)
    assert choice.dtype == "bfloat16" and not choice.changed
    assert why in choice.reason


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match="'float32' is not one of"):
        choose_dtype(FLOAT32, {FLOAT32: 1.0}, 1, 1)
    with pytest.raises(ValueError, match=r"no timing for \['float32'\]"):
        choose_dtype("bfloat16", {"bfloat16": 1.0}, 1, 1)


def test_half_dtype_is_the_checkpoints_or_bfloat16():
    assert half_dtype("float16") == "float16" and half_dtype("bfloat16") == "bfloat16"
    assert half_dtype(FLOAT32) == "bfloat16" and half_dtype(None) == "bfloat16"


def test_checkpoint_dtype_reads_either_config_spelling():
    assert checkpoint_dtype(SimpleNamespace(torch_dtype="bfloat16")) == "bfloat16"
    assert checkpoint_dtype(SimpleNamespace(torch_dtype=None, dtype="torch.float16")) == "float16"
    assert checkpoint_dtype(SimpleNamespace()) is None


def test_fp32_weight_bytes_scales_the_weight_files(tmp_path):
    target, draft = tmp_path / "t", tmp_path / "d"
    for path, size in ((target, 1000), (draft, 200)):
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"\0" * size)
        (path / "config.json").write_text("{}")  # not a weight file
    assert fp32_weight_bytes([target], "bfloat16") == 2000
    assert fp32_weight_bytes([target, draft], "bfloat16") == 2400
    assert fp32_weight_bytes([target], FLOAT32) == 1000
    assert fp32_weight_bytes([tmp_path / "missing"], "bfloat16") is None  # a hub id, not a directory
    assert fp32_weight_bytes([target], "int8") is None


CONFIG = SimpleNamespace(hidden_size=64, intermediate_size=128, torch_dtype="bfloat16")


def _timer(fp32_ms: float):
    def timer(hidden, intermediate, half):
        assert (hidden, intermediate) == (64, 128)
        return ((half, 10.0), (FLOAT32, fp32_ms))

    return timer


@pytest.mark.parametrize(
    ("chosen", "config"),
    [
        (("cuda", "auto", "m", None), CONFIG),  # a GPU: SGLang's choice
        (("cpu", "bfloat16", "m", None), CONFIG),  # the user chose
        (("cpu", "float32", "m", None), CONFIG),
        (("cpu", "auto", "m", None), SimpleNamespace(**vars(CONFIG), quantization_config={"quant_method": "fp8"})),
        (("cpu", "auto", "m", None), SimpleNamespace(hidden_size=64, torch_dtype="bfloat16")),  # no MLP size
    ],
)
def test_launches_that_are_not_ours_to_decide_are_left_alone(chosen, config):
    assert cpu_dtype_choice(chosen, config, timer=_timer(1.0)) is None


def test_an_auto_cpu_launch_weighs_its_own_checkpoint(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1024)
    choice = cpu_dtype_choice(("cpu", "auto", str(tmp_path), None), CONFIG, timer=_timer(2.0))
    assert choice.dtype == FLOAT32 and choice.half == "bfloat16"
    slow = cpu_dtype_choice(("cpu", "auto", str(tmp_path), None), CONFIG, timer=_timer(30.0))
    assert slow.dtype == "bfloat16" and not slow.changed


def test_the_timing_runs_both_dtypes():
    ms = dtype_choice.time_dtypes(32, 64, "bfloat16")
    assert set(ms) == {"bfloat16", FLOAT32} and all(v > 0 for v in ms.values())


# -- SGLang's own argument resolution, as `python -m sglang.launch_server` runs it ---------------

RESOLVE = cpu_checks.add("dtype-resolution", """
from sglang_specsot import plugin
plugin.register()
from sglang_specsot.cpu import dtype as cpu_dtype
from sglang.srt.server_args import prepare_server_args
from sglang.srt.arg_groups.overrides import resolution_result
base = ["--model-path", TINY_MODEL, "--device", "cpu"]
result = {}
for fp32_ms, name, extra in ((1.0, "fp32 faster", []), (30.0, "bf16 faster", []),
                             (1.0, "explicit", ["--dtype", "bfloat16"])):
    cpu_dtype._timed = lambda hidden, intermediate, half, ms=fp32_ms: ((half, 10.0), ("float32", ms))
    sa = prepare_server_args(base + extra)
    sa.resolve_once()
    result[name] = resolution_result(sa, "dtype")
""")  # fmt: skip


@pytest.fixture(scope="module")
def resolved(cpu_process) -> dict:
    return cpu_process(RESOLVE)


def test_sglang_resolution_runs_float32_where_it_timed_faster(resolved):
    assert resolved["fp32 faster"] == FLOAT32


def test_sglang_resolution_keeps_auto_and_explicit_choices_otherwise(resolved):
    assert resolved["bf16 faster"] == "auto"  # SGLang's own auto: the checkpoint's dtype
    assert resolved["explicit"] == "bfloat16"

