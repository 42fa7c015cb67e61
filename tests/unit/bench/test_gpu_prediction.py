"""The GPU prediction: the roofline's shapes and regimes, and the routes' pricing."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_specsot.bench import gpu_prediction as gp
from sglang_specsot.costs.cost_model import CostModel

ROOT = Path(__file__).resolve().parents[3]
SHAPE = gp.AnswerShape(plain_tokens=200, skeleton_tokens=20, branch_tokens=(30, 50, 80))


def _cost(gpu: gp.GpuSpec = gp.H100_SXM) -> CostModel:
    return CostModel(gp.roofline_cost(gp.QWEN25_1_5B, gpu, 600), gp.roofline_cost(gp.QWEN25_0_5B, gpu, 600))


@pytest.mark.parametrize(
    "shape, billions", [(gp.QWEN25_1_5B, 1.54), (gp.QWEN25_0_5B, 0.49), (gp.QWEN25_7B, 7.6)]
)
def test_parameter_counts_match_the_published_sizes(shape, billions):
    assert shape.params() / 1e9 == pytest.approx(billions, rel=0.02)


def test_roofline_is_memory_bound_at_one_row_and_compute_bound_at_many():
    gpu, shape = gp.H100_SXM, gp.QWEN25_1_5B
    weights_ms = 1e3 * shape.matmul_params() * gp.BF16_BYTES / gpu.hbm_bytes_per_s
    assert gp.roofline_ms(shape, gpu, 1, 0) == pytest.approx(weights_ms)
    assert gp.roofline_ms(shape, gpu, 2, 0) == gp.roofline_ms(shape, gpu, 1, 0)  # rows are free there
    flops_ms = 1e3 * 2 * shape.matmul_params() * 8192 / gpu.bf16_flops_per_s
    assert gp.roofline_ms(shape, gpu, 8192, 0) == pytest.approx(flops_ms)
    assert flops_ms > 10 * weights_ms


def test_kv_is_read_once_a_request_however_many_rows():
    gpu, shape = gp.H100_SXM, gp.QWEN25_1_5B
    one, many = gp.roofline_ms(shape, gpu, 1, 4000, max_requests=1), gp.roofline_ms(shape, gpu, 64, 4000, max_requests=1)
    assert one > gp.roofline_ms(shape, gpu, 1, 0) and many == pytest.approx(one)


def test_plain_is_its_prefill_and_one_batch_1_step_a_token():
    cost = _cost()
    ms = gp.predict_ms(cost, SHAPE, [0.7, 0.7])["plain"]
    assert ms == pytest.approx(cost.target.ms(SHAPE.plain_prompt) + (SHAPE.plain_tokens - 1) * cost.target.ms(1))


def test_sot_decodes_the_branches_together_as_the_batch_shrinks():
    cost = _cost()
    ms = gp._decode_ms(cost, [3, 5], None)  # two steps of both, then two of the longer alone
    assert ms == pytest.approx(2 * cost.target.ms(2) + 2 * cost.target.ms(1))


def test_zero_acceptance_drafts_nothing_and_costs_only_the_draft_prefills():
    cost = _cost()
    ms = gp.predict_ms(cost, SHAPE, [0.0, 0.0, 0.0])
    draft_prefills = cost.draft.ms(SHAPE.plain_prompt)
    assert ms["SPECSOT-only"] == pytest.approx(ms["plain"] + draft_prefills)
    branch_rows = SHAPE.branch_prefix + SHAPE.skeleton_tokens + SHAPE.branch_prompt * len(SHAPE.branch_tokens)
    sot_draft_prefills = cost.draft.ms(SHAPE.skeleton_prompt) + cost.draft.ms(branch_rows)
    assert ms["SpecSoT"] == pytest.approx(ms["SoT-only"] + sot_draft_prefills)


def test_good_acceptance_makes_speculation_faster_and_the_overhead_dearer_to_it():
    fast, slow = _cost(), _cost(gp.GpuSpec("slow host", 3.35e12, 989e12, overhead_ms=0.5))
    for cost in (fast, slow):
        ms = gp.predict_ms(cost, SHAPE, [0.8] * 4)
        assert ms["SPECSOT-only"] < ms["plain"] and ms["SpecSoT"] < ms["SoT-only"]
    gain = lambda c: (lambda m: m["plain"] / m["SPECSOT-only"])(gp.predict_ms(c, SHAPE, [0.8] * 4))  # noqa: E731
    assert gain(slow) < gain(fast)


def test_host_time_a_step_slows_speculation_until_it_declines_to_draft():
    cost = _cost()
    free, dear = (gp.predict_ms(cost, SHAPE, [0.8] * 4, host_ms=h) for h in (0.0, 3.0))
    assert free["SPECSOT-only"] < dear["SPECSOT-only"]
    # Host time a step dearer than the steps it saves: every step is plain, only the draft's
    # prefill stays (SPECSOT's policy never drafts slower than plain).
    never = gp.predict_ms(cost, SHAPE, [0.8] * 4, host_ms=1e3)
    assert never["SPECSOT-only"] == pytest.approx(never["plain"] + cost.draft.ms(SHAPE.plain_prompt))


def test_a_share_of_the_bandwidth_slows_the_memory_bound_forward_alike():
    full = gp.roofline_ms(gp.QWEN25_1_5B, gp.H100_SXM, 1, 0)
    share = gp.GpuSpec("h", gp.H100_SXM.hbm_bytes_per_s, gp.H100_SXM.bf16_flops_per_s, 0.0, bandwidth_share=0.8)
    assert gp.roofline_ms(gp.QWEN25_1_5B, share, 1, 0) == pytest.approx(full / 0.8)


def test_the_table_reads_the_repository_traces_and_says_it_is_a_prediction():
    table = gp.prediction_table(ROOT)
    assert table.startswith("A PREDICTION, not a measurement")
    assert "Qwen2.5-1.5B + Qwen2.5-0.5B, 0.3, 4.5" in table and "Qwen2.5-7B + Qwen2.5-0.5B, 1.0, 0.0" in table
