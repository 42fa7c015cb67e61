"""The scale-out simulation: exact on a case worked by hand, and the behaviour a deployment shows."""

from __future__ import annotations

import pytest

from sglang_specsot.bench.scale_sim import Deployment, Workload, simulate
from sglang_specsot.sot.latency import AnswerShape, RowCosts

FLAT = RowCosts((1, 64), (10.0, 10.0))  # every forward 10 ms, whatever its rows: rows are free
LINEAR = RowCosts((1, 64), (10.0, 640.0))  # k rows cost k forwards of one row
# Flat over a few rows, RISING beyond: a GPU's shape, and the AVX-512 CPU's over small batches.
RISING = RowCosts((1, 8, 32, 128, 512), (10.0, 11.0, 14.0, 40.0, 160.0))
SHAPE = AnswerShape(normal_tokens=100, skeleton_tokens=20, branch_tokens=(30, 30, 30, 30), max_running=4,
                    prompt_tokens=20, skeleton_prompt_tokens=40, branch_prompt_tokens=60)  # fmt: skip


def test_one_client_plain_is_a_prefill_and_its_decode_steps():
    # A prefill forward (which samples the first token) and 99 decode forwards, 10 ms each.
    result = simulate(Deployment(1, FLAT), Workload(1, SHAPE, sot_share=0.0), seconds=30.0, warmup_s=1.0)
    assert result.latency["normal"]["p50"] == pytest.approx(1.0)
    assert result.requests_per_s == pytest.approx(1.0, rel=0.05)
    assert "sot" not in result.latency


def test_one_client_sot_is_skeleton_then_its_branches_at_once():
    # Skeleton: 1 + 19 forwards; branches: one prefill (the 4 started together) + 29 decode forwards.
    result = simulate(Deployment(1, FLAT), Workload(1, SHAPE, sot_share=1.0, sot_mode="on"), seconds=30.0,
                      warmup_s=1.0)  # fmt: skip
    assert result.latency["sot"]["p50"] == pytest.approx(0.5)


def test_auto_takes_sot_where_rows_are_free_and_never_where_they_are_linear():
    cheap = simulate(Deployment(1, FLAT), Workload(1, SHAPE, sot_share=1.0), seconds=30.0, warmup_s=1.0)
    linear = simulate(Deployment(1, LINEAR), Workload(1, SHAPE, sot_share=1.0), seconds=60.0, warmup_s=1.0)
    assert cheap.sot_chosen == 1.0 and linear.sot_chosen == 0.0
    # What was asked and how it was answered are reported apart: on linear rows every SoT
    # request was answered normally.
    assert "sot" not in linear.latency and linear.latency["asked_sot"] == linear.latency["normal"]


def test_auto_steps_aside_as_the_clients_fill_the_rows():
    few = simulate(Deployment(1, RISING), Workload(1, SHAPE, sot_share=1.0), seconds=60.0, warmup_s=5.0)
    many = simulate(Deployment(1, RISING), Workload(32, SHAPE, sot_share=1.0), seconds=60.0, warmup_s=5.0)
    assert few.sot_chosen == 1.0 and many.sot_chosen < 0.5


@pytest.mark.parametrize("policy", ["round_robin", "least_load"])
def test_replicas_carry_load_in_proportion(policy):
    one = simulate(Deployment(1, RISING, policy), Workload(32, SHAPE, sot_share=0.0), seconds=60.0, warmup_s=5.0)
    four = simulate(Deployment(4, RISING, policy), Workload(128, SHAPE, sot_share=0.0), seconds=60.0, warmup_s=5.0)
    assert four.requests_per_s == pytest.approx(4 * one.requests_per_s, rel=0.1)
    assert four.latency["normal"]["p50"] == pytest.approx(one.latency["normal"]["p50"], rel=0.1)


def test_answers_of_spread_lengths_spread_the_latencies():
    fixed = simulate(Deployment(1, RISING), Workload(8, SHAPE, sot_share=0.0), seconds=60.0, warmup_s=5.0)
    spread = simulate(Deployment(1, RISING), Workload(8, SHAPE, sot_share=0.0, length_spread=0.5), seconds=60.0,
                      warmup_s=5.0)  # fmt: skip
    assert fixed.latency["normal"]["p95"] == fixed.latency["normal"]["p50"]
    assert spread.latency["normal"]["p95"] > 1.2 * spread.latency["normal"]["p50"]


def test_least_load_evens_out_what_round_robin_does_not():
    # Mixed SoT and plain: round robin lands SoT answers' branches unevenly; least-load routes
    # each request to the emptier replica.
    work = Workload(48, SHAPE, sot_share=0.5, sot_mode="on")
    rr = simulate(Deployment(3, RISING, "round_robin"), work, seconds=120.0, warmup_s=10.0, seed=1)
    ll = simulate(Deployment(3, RISING, "least_load"), work, seconds=120.0, warmup_s=10.0, seed=1)
    assert ll.latency["normal"]["p95"] <= rr.latency["normal"]["p95"]


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: Deployment(0, FLAT), "replicas=0"),
        (lambda: Deployment(1, FLAT, "random"), "policy='random'"),
        (lambda: Deployment(1, FLAT, max_running=0), "max_running=0"),
        (lambda: Workload(0, SHAPE), "clients=0"),
        (lambda: Workload(1, SHAPE, sot_share=1.5), "sot_share=1.5"),
        (lambda: Workload(1, SHAPE, sot_mode="maybe"), "sot_mode='maybe'"),
        (lambda: Workload(1, SHAPE, length_spread=1.0), "length_spread=1.0"),
        (lambda: simulate(Deployment(1, FLAT), Workload(1, SHAPE), seconds=10.0, warmup_s=10.0), "seconds=10.0"),
    ],
)
def test_bad_inputs_name_the_value(make, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        make()


def test_the_command_reads_a_replicas_server_info_and_writes_each_row(tmp_path, capsys):
    import json

    from sglang_specsot.bench.__main__ import main

    info = {"internal_states": [{"specsot_row_costs": {"probe_rows": list(RISING.rows), "probe_ms": list(RISING.ms),
                                                       "overhead_ms": 2.0}}]}  # fmt: skip
    (tmp_path / "info.json").write_text(json.dumps(info))
    out = tmp_path / "sim.json"
    argv = ["scale-sim", "--costs", str(tmp_path / "info.json"), "--replicas", "1,2", "--load", "1,2",
            "--clients", "4", "--seconds", "20", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["replicas"], r["clients"]) for r in rows] == [(1, 4), (1, 8), (2, 4), (2, 8)]
    assert "replicas 2, load 2x (8 clients)" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("{}")
    assert main(["scale-sim", "--costs", str(tmp_path / "bad.json")]) == 2
