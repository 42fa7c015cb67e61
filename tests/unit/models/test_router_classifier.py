"""Training the router's question classifier, without the embedding model: the fit, the
folds, the pre-registered selection rule, and the classifier's guard on its embedding."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_specsot.models import router_classifier as rc
from sglang_specsot.sot.agreement import RouterAgreement, load_labelled
from sglang_specsot.sot.router_head import LinearHead


def test_the_fit_separates_separable_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 8))
    y = (x[:, 0] - 0.5 * x[:, 3] > 0.2).astype(float)
    head = rc.fit_head(x, y, l2=0.01, threshold=0.5)
    predicted = np.array([head.suitability(v).use_sot for v in x])
    assert (predicted == y.astype(bool)).mean() >= 0.97
    assert head.embedding == rc.NAME and len(head.weights) == 8


def test_a_stronger_l2_shrinks_the_weights():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(100, 4)), (rng.random(100) > 0.5).astype(float)
    weak, strong = rc.fit_head(x, y, 0.01, 0.5), rc.fit_head(x, y, 10.0, 0.5)
    assert np.linalg.norm(strong.weights) < np.linalg.norm(weak.weights)


def test_training_reads_only_the_training_sets_with_stratified_folds():
    data = rc.load_training_set()
    assert len(data.questions) == 1030 + 264 + 42 + 48 == len(data.labels) == len(data.folds)
    assert set(np.unique(data.folds)) == set(range(rc.FOLDS))
    checks = {row.question for name in rc.NEVER_TRAINED_ON for row in load_labelled(name)}
    assert not checks & set(data.questions)
    # every fold holds some of each label, so each CV fit sees both
    for fold in range(rc.FOLDS):
        assert 0 < data.labels[data.folds == fold].mean() < 1


def point(l2, threshold, tp, fp, fn, tn) -> rc.GridPoint:
    return rc.GridPoint(l2, threshold, RouterAgreement(tp, fp, fn, tn))


def test_selection_is_the_most_accurate_point_precise_enough():
    imprecise = point(0.1, 0.4, 20, 4, 0, 176)  # accuracy 0.98, precision 0.83
    chosen = point(0.3, 0.5, 16, 1, 4, 179)  # accuracy 0.975, precision 0.94
    worse = point(0.3, 0.6, 14, 0, 6, 180)  # accuracy 0.97, precision 1.00
    assert rc.MIN_PRECISION == 0.85 and rc.select([imprecise, chosen, worse]) is chosen
    tie = point(0.01, 0.6, 15, 0, 5, 180)  # accuracy 0.975, precision 1.00: the tie goes to precision
    assert rc.select([chosen, tie]) is tie
    with pytest.raises(ValueError, match=f"precision {rc.MIN_PRECISION}"):
        rc.select([imprecise])


def test_the_rule_serves_any_grid_and_any_precision_floor():
    # The examples choose depths, epochs or thresholds by the same rule (rc.most_accurate).
    grid = [(("L12", 3), RouterAgreement(20, 4, 0, 176)), (("L20", 4), RouterAgreement(16, 1, 4, 179)),
            (("L20", 5), RouterAgreement(16, 1, 4, 179))]  # fmt: skip
    assert rc.most_accurate(grid)[0] == ("L20", 4)  # of equals, the first
    assert rc.most_accurate(grid, min_precision=0.80)[0] == ("L12", 3)  # precision 0.83 admitted
    with pytest.raises(ValueError, match="precision 0.99"):
        rc.most_accurate(grid, min_precision=0.99)


def test_route_agreement_scores_the_routing_as_shipped():
    questions = ["Solve for x: 2x = 4.", "How can I sleep better?", "Why is the sky blue?"]
    labels = np.array([0.0, 1.0, 1.0])
    # the hard math rule overrides the classifier's 0.99; the other two follow it
    agreement = rc.route_agreement(questions, labels, np.array([0.99, 0.9, 0.3]), 0.5)
    assert (agreement.true_pos, agreement.false_pos, agreement.false_neg, agreement.true_neg) == (1, 0, 1, 1)


class FakeEmbedder:
    def encode(self, texts):
        import torch

        return torch.tensor([[1.0, float(len(t) % 2)] for t in texts])


def test_the_classifier_scores_the_embedding_of_the_question():
    classifier = rc.EmbeddingClassifier(LinearHead((0.0, 4.0), -2.0, 0.5, rc.NAME), FakeEmbedder())
    assert classifier("odd").use_sot and not classifier("even").use_sot


def test_the_classifier_refuses_a_head_of_another_embedding():
    with pytest.raises(ValueError, match="retrain the head"):
        rc.EmbeddingClassifier(LinearHead((1.0,), 0.0, 0.5, "other-model"), FakeEmbedder())


def test_no_check_question_repeats_a_training_question():
    training = {q.strip().lower() for q in rc.load_training_set().questions}
    for name in rc.NEVER_TRAINED_ON:
        repeated = [r.question for r in load_labelled(name) if r.question.strip().lower() in training]
        assert not repeated, (name, repeated)


def test_the_classifier_encodes_one_question_at_a_time():
    import threading
    import time

    class Watching(FakeEmbedder):
        inside, most = 0, 0

        def encode(self, texts):
            Watching.inside += 1
            Watching.most = max(Watching.most, Watching.inside)
            time.sleep(0.001)  # let another thread in, were the classifier not locked
            try:
                return super().encode(texts)
            finally:
                Watching.inside -= 1

    classifier = rc.EmbeddingClassifier(LinearHead((0.0, 4.0), -2.0, 0.5, rc.NAME), Watching())
    threads = [threading.Thread(target=lambda: [classifier("q" * i) for i in range(20)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Watching.most == 1


def test_the_training_sets_hold_labels_by_others_and_never_a_check_set():
    assert rc.TRAIN_SETS[0] == "sot_lima" and "sot_wizardlm" in rc.NEVER_TRAINED_ON
    assert not set(rc.TRAIN_SETS) & set(rc.NEVER_TRAINED_ON)
    with pytest.raises(ValueError, match=r"\['sot_wizardlm'\] are check sets"):
        rc.train(sets=("sot_lima", "sot_wizardlm"))
