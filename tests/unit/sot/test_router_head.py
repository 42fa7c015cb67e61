"""The question classifier's pure side: the linear head, the shipped head's provenance, and
where the classifier's verdict sits among the router's rules and in the route phase."""

from __future__ import annotations

import json
import math

import pytest

from sglang_specsot.sot import SoTConfig
from sglang_specsot.sot.router import hard_route, route_question
from sglang_specsot.sot.router_head import HEAD_PATH, LinearHead, Suitability, load_head
from sglang_specsot.sot.runner import SoTOptions, route_phase


def head(weights=(1.0, -1.0), bias=0.0, threshold=0.5) -> LinearHead:
    return LinearHead(tuple(weights), bias, threshold, "test-embedding")


def test_probability_is_the_logistic_of_the_score():
    assert head().probability([0.3, 0.3]) == pytest.approx(0.5)
    assert head().probability([2.0, 0.0]) == pytest.approx(1 / (1 + math.exp(-2)))
    assert head(bias=-1.0).probability([0.0, 0.0]) == pytest.approx(1 / (1 + math.e))
    # far from zero in either direction: no overflow, still a probability
    assert head().probability([1e4, 0.0]) == 1.0 and head().probability([-1e4, 0.0]) == 0.0


def test_suitability_compares_with_the_threshold():
    assert head(threshold=0.4).suitability([0.0, 0.0]).use_sot  # 0.5 >= 0.4
    assert not head(threshold=0.6).suitability([0.0, 0.0]).use_sot
    assert Suitability(0.4, 0.4).use_sot


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"weights": ()}, "weights"),
        ({"weights": (1.0, float("nan"))}, "weights"),
        ({"bias": float("inf")}, "bias=inf"),
        ({"threshold": 1.0}, "threshold=1.0"),
        ({"threshold": 0.0}, "threshold=0.0"),
    ],
)
def test_a_bad_head_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        head(**kwargs)


def test_an_embedding_of_the_wrong_size_is_named():
    with pytest.raises(ValueError, match="has 3 numbers, the head expects 2"):
        head().probability([1.0, 2.0, 3.0])


def test_a_head_survives_its_json(tmp_path):
    original = LinearHead((0.25, -0.5), 0.125, 0.4, "e", {"trained_on": ["x"]})
    path = tmp_path / "head.json"
    path.write_text(original.to_json())
    loaded = load_head(path)
    assert loaded == original and loaded.provenance == {"trained_on": ["x"]}


@pytest.mark.parametrize("text", ["{oops", '{"weights": [1.0]}', json.dumps({"weights": [1], "bias": 0,
                                  "threshold": 2, "embedding": "e"})])  # fmt: skip
def test_a_bad_head_file_is_named_with_the_fix(tmp_path, text):
    path = tmp_path / "head.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="router_classifier train") as info:
        load_head(path)
    assert str(path) in str(info.value)


def test_the_shipped_head_says_how_it_was_made_and_what_it_never_saw():
    shipped = load_head()
    assert HEAD_PATH.name == "router_classifier.json"
    assert len(shipped.weights) == 384 and shipped.embedding == "all-MiniLM-L6-v2"
    trained_on = set(shipped.provenance["trained_on"])
    assert trained_on == {"sot_lima", "router_train", "router_traps", "router_holdout"}
    checks = {"sot_wizardlm", "vicuna80", "router_holdout2"}
    assert not trained_on & checks and set(shipped.provenance["never_trained_on"]) == checks
    assert shipped.provenance["cross_validated"]["precision"] >= 0.85
    assert shipped.threshold == shipped.provenance["cross_validated"]["threshold"]


# -- the verdict among the rules --------------------------------------------------------------

SUITABLE = "How can I improve my time management skills?"
SOFT_NORMAL = "Why is the sky blue?"  # the soft "mechanism" rule says normal


def test_the_hard_rules_decide_before_the_classifier():
    decision = route_question("Solve for x: 3x + 10 = 5x - 10.", suitability=Suitability(0.99, 0.5))
    assert (decision.use_sot, decision.rule, decision.source) == (False, "math", "rules")
    capped = route_question(SUITABLE, max_new_tokens=50, suitability=Suitability(0.99, 0.5))
    assert capped.rule == "short_cap"


@pytest.mark.parametrize("question, probability, use_sot", [(SUITABLE, 0.1, False), (SOFT_NORMAL, 0.9, True)])
def test_the_classifier_decides_instead_of_the_soft_rules(question, probability, use_sot):
    assert route_question(question).use_sot is not use_sot  # the soft rules say the opposite
    decision = route_question(question, suitability=Suitability(probability, 0.5))
    assert (decision.use_sot, decision.rule, decision.source) == (use_sot, "classifier", "classifier")
    assert f"{probability:.2f}" in decision.reason and "0.50" in decision.reason


def test_a_model_verdict_decides_before_the_classifier():
    decision = route_question(SUITABLE, model_reply="direct", suitability=Suitability(0.9, 0.5))
    assert (decision.use_sot, decision.source) == (False, "model")


# -- the route phase --------------------------------------------------------------------------


class CountingClassifier:
    def __init__(self, probability: float) -> None:
        self.probability, self.questions = probability, []

    def __call__(self, question: str) -> Suitability:
        self.questions.append(question)
        return Suitability(self.probability, 0.5)


def test_route_phase_asks_the_classifier_in_mode_auto_only():
    classifier = CountingClassifier(0.1)
    route = route_phase(SUITABLE, SoTOptions(mode="auto", classifier=classifier))
    assert classifier.questions == [SUITABLE] and route.decision.rule == "classifier"
    assert not route.decision.use_sot
    for mode in ("on", "off"):
        route_phase(SUITABLE, SoTOptions(mode=mode, classifier=classifier))
    assert classifier.questions == [SUITABLE]


def test_route_phase_does_not_classify_what_is_already_decided():
    classifier = CountingClassifier(0.9)
    math = route_phase("Solve for x: 3x + 10 = 5x - 10.", SoTOptions(mode="auto", classifier=classifier))
    assert math.decision.rule == "math"
    capped = route_phase(SUITABLE, SoTOptions(mode="auto", classifier=classifier, max_new_tokens=50))
    assert capped.decision.rule == "short_cap"
    assert classifier.questions == []
    assert hard_route("Solve for x: 3x + 10 = 5x - 10.").rule == "math"
    assert hard_route("  ").rule == "empty" and hard_route(None).rule == "empty"
    assert hard_route(SUITABLE) is None


def test_options_refuse_a_classifier_that_cannot_be_called():
    with pytest.raises(ValueError, match="classifier must be a callable"):
        SoTOptions(classifier=0.5)
    assert SoTOptions(config=SoTConfig(), classifier=CountingClassifier(0.5)).classifier is not None
