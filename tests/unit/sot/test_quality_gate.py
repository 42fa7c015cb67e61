"""The quality router's gate: its skeleton numbers, its head, where it vetoes, how it is loaded."""

from __future__ import annotations

import asyncio
import math

import pytest

from sglang_specsot.sot import quality_gate as qg
from sglang_specsot.sot.quality_gate import (
    FEATURE_NAMES,
    QUESTION,
    SKELETON,
    SKELETON_FEATURES,
    QualityGate,
    configured_quality_gate,
    load_quality_gate,
    skeleton_features,
)
from sglang_specsot.sot.router_head import LinearHead, Suitability
from sglang_specsot.sot.runner import NORMAL, PLAIN, SKELETON as SKELETON_ROLE, SOT, SoTOptions, run_sot
from tests.unit.sot.test_runner import QUESTION as TIME_QUESTION, FakeBackend, render


def gate(weights, bias, threshold=0.5, embedding=SKELETON_FEATURES) -> QualityGate:
    return QualityGate(LinearHead(tuple(weights), bias, threshold, embedding))


UNIT = [1.0 / 384**0.5] * 384


def question_gate(bias: float) -> QualityGate:
    return gate([0.0] * 384, bias, embedding="all-MiniLM-L6-v2")  # P(worse) = sigmoid(bias)


def test_skeleton_features_read_count_overlap_drift_and_lengths():
    question = "What are good ways to reduce screen time?"
    titles = ["Set a screen timer", "Use apps", "Set a screen timer daily", "Go outside"]
    points, overlap, off, words, asked = skeleton_features(question, titles)
    assert points == 4.0
    # stems: {set, screen, timer} vs {set, screen, timer, daily}: 3 of 4 shared
    assert overlap == pytest.approx(0.75)
    assert off == pytest.approx(0.5)  # "Use apps" and "Go outside" share no content word with the question
    assert words == pytest.approx((4 + 2 + 5 + 2) / 4)
    assert asked == 8.0
    assert len(FEATURE_NAMES) == 5


def test_skeleton_features_refuse_an_empty_plan():
    with pytest.raises(ValueError, match="no points"):
        skeleton_features("Why?", [])


def test_a_gate_reads_only_its_own_representation():
    on_plan = gate([1, 0, 0, 0, 0], -4.5)  # P(worse) = sigmoid(points - 4.5)
    verdict = on_plan.on_plan("q", ["a", "b", "c", "d", "e"])
    assert verdict.probability == pytest.approx(1 / (1 + math.exp(-0.5))) and verdict.worse
    assert "P(SoT reads worse)=0.62 >= 0.50" in verdict.reason and on_plan.representation == SKELETON
    assert not on_plan.on_plan("q", ["a", "b", "c"]).worse
    assert on_plan.on_question([0.0] * 5) is None
    on_question = question_gate(1.0)
    assert on_question.representation == QUESTION and on_question.on_plan("q", ["a", "b"]) is None
    assert on_question.on_question(UNIT).worse


def test_a_question_head_must_read_the_classifiers_embedding():
    with pytest.raises(ValueError, match="reads 'all-MiniLM-L6-v2' embeddings of 384 numbers"):
        gate([0.5, 0.5], 0.0, embedding="all-MiniLM-L6-v2")
    with pytest.raises(ValueError, match="this one 'another-encoder' of 384"):
        gate([0.5] * 384, 0.0, embedding="another-encoder")


def test_a_skeleton_head_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="needs 5 weights"):
        gate([1.0, 2.0], 0.0)


def test_loading_a_missing_head_is_no_gate_and_a_broken_one_an_error(tmp_path):
    assert load_quality_gate(tmp_path / "absent.json") is None
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        load_quality_gate(broken)
    good = tmp_path / "head.json"
    good.write_text(LinearHead((1.0,) * 5, 0.0, 0.5, SKELETON_FEATURES).to_json())
    assert load_quality_gate(good).representation == SKELETON


@pytest.fixture
def environment(monkeypatch):
    configured_quality_gate.cache_clear()
    yield monkeypatch
    configured_quality_gate.cache_clear()


def test_the_environment_names_the_head_or_turns_it_off(environment, tmp_path):
    head = tmp_path / "head.json"
    head.write_text(LinearHead((1.0,) * 5, 0.0, 0.5, SKELETON_FEATURES).to_json())
    environment.setenv(qg.QUALITY_HEAD_ENV, str(head))
    assert configured_quality_gate().representation == SKELETON
    configured_quality_gate.cache_clear()
    environment.setenv(qg.QUALITY_HEAD_ENV, "off")
    assert configured_quality_gate() is None
    configured_quality_gate.cache_clear()
    environment.setenv(qg.QUALITY_HEAD_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="SGLANG_SPECSOT_QUALITY_HEAD=.*no file"):
        configured_quality_gate()
    configured_quality_gate.cache_clear()
    environment.delenv(qg.QUALITY_HEAD_ENV)
    environment.setattr(qg, "QUALITY_HEAD_PATH", tmp_path / "none-shipped.json")
    assert configured_quality_gate() is None


def test_options_refuse_a_gate_of_the_wrong_type():
    with pytest.raises(ValueError, match="quality_gate must be"):
        SoTOptions(quality_gate=lambda question: True)


ALWAYS_WORSE = gate([0, 0, 0, 0, 0], 5.0)  # P(worse) = 0.99 whatever the plan
NEVER_WORSE = gate([0, 0, 0, 0, 0], -5.0)


def test_auto_answers_normally_where_the_gate_finds_the_planned_skeleton_worse():
    fake = FakeBackend()
    answer = asyncio.run(run_sot(TIME_QUESTION, fake, render, SoTOptions(mode="auto", quality_gate=ALWAYS_WORSE)))
    assert answer.path == NORMAL and answer.reason.startswith("the quality head (skeleton)")
    # The veto comes after the skeleton and before any branch: only the skeleton was spent.
    assert [r.tag.role for r in fake.requests] == [SKELETON_ROLE, PLAIN]
    assert answer.skeleton is not None and answer.answer == "A normal answer."


def test_the_gate_lets_a_plan_through_and_never_touches_mode_on():
    assert asyncio.run(run_sot(TIME_QUESTION, FakeBackend(), render,
                               SoTOptions(mode="auto", quality_gate=NEVER_WORSE))).path == SOT  # fmt: skip
    assert asyncio.run(run_sot(TIME_QUESTION, FakeBackend(), render,
                               SoTOptions(mode="on", quality_gate=ALWAYS_WORSE))).path == SOT  # fmt: skip


def test_auto_answers_normally_where_a_question_head_finds_sot_worse_before_any_skeleton():
    classify = lambda question: Suitability(0.9, 0.5, tuple(UNIT))  # noqa: E731
    fake = FakeBackend()
    worse = SoTOptions(mode="auto", classifier=classify, quality_gate=question_gate(3.0))
    answer = asyncio.run(run_sot(TIME_QUESTION, fake, render, worse))
    assert answer.path == NORMAL and answer.route.decision.rule == "quality"
    assert answer.route.decision.source == "quality_head" and [r.tag.role for r in fake.requests] == [PLAIN]
    better = SoTOptions(mode="auto", classifier=classify, quality_gate=question_gate(-3.0))
    assert asyncio.run(run_sot(TIME_QUESTION, FakeBackend(), render, better)).path == SOT
    # Without the classifier's vector (the rules router) a question head has nothing to read.
    assert asyncio.run(run_sot(TIME_QUESTION, FakeBackend(), render,
                               SoTOptions(mode="auto", quality_gate=question_gate(3.0)))).path == SOT  # fmt: skip
