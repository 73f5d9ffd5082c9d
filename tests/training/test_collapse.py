"""A collapsed model is named: the figures by hand, and the line that says what happened and what to try."""
from __future__ import annotations

import pytest

from training.collapse import (
    COLLAPSE_SHARE, classification_figures, diagnose, diagnose_mlm, regression_figures, tagging_figures,
)


def test_classification_figures_by_hand():
    f = classification_figures([0, 0, 0, 1, 1, 2, 2, 2, 2, 2], [2, 2, 2, 2, 2, 2, 2, 2, 2, 1])
    assert f == {"predicted_top_share": pytest.approx(0.9), "majority_share": pytest.approx(0.5)}


def test_a_classifier_predicting_one_class_is_named_with_its_figure_and_advice():
    found = diagnose("classification", {"eval_predicted_top_share": 1.0, "eval_majority_share": 0.504,
                                        "eval_accuracy": 0.504}, lr=1e-7, epochs=3)
    assert found is not None
    assert "one class for 100.0%" in found.figure and "50.4%" in found.figure
    assert "--lr (this run: 1e-07)" in found.message and "--epochs (this run: 3)" in found.message


@pytest.mark.parametrize("share, collapsed", [(COLLAPSE_SHARE - 0.01, False), (COLLAPSE_SHARE, True)])
def test_nearly_one_class_is_the_threshold(share, collapsed):
    found = diagnose("pair_classification", {"predicted_top_share": share, "majority_share": 0.9}, 1e-4, 3)
    assert (found is not None) == collapsed


def test_a_classifier_no_better_than_the_majority_is_named_too():
    found = diagnose("classification", {"eval_predicted_top_share": 0.6, "eval_majority_share": 0.504,
                                        "eval_accuracy": 0.51, "eval_mcc": 0.02}, lr=1e-7, epochs=3)
    assert found is not None and "no better than always predicting the majority class" in found.figure
    assert diagnose("classification", {"eval_predicted_top_share": 0.6, "eval_majority_share": 0.504,
                                       "eval_accuracy": 0.62, "eval_mcc": 0.24}, lr=1e-3, epochs=3) is None


def test_a_regressor_predicting_a_near_constant_is_named():
    y = [0.0, 1.0, 2.0, 3.0, 4.0]
    assert regression_figures(y, [2.0] * 5) == {"prediction_spread": 0.0}
    assert diagnose("regression", regression_figures(y, [2.0, 2.01, 2.0, 1.99, 2.0]), 1e-5, 2) is not None
    assert diagnose("regression", regression_figures(y, [0.5, 1.0, 2.2, 2.9, 3.5]), 1e-5, 2) is None


def test_a_tagger_of_only_outside_tags_is_named():
    truth = [["B-person", "O", "O"], ["O", "B-loc", "I-loc"]]
    only_o = [["O", "O", "O"], ["O", "O", "O"]]
    f = tagging_figures(truth, only_o)
    assert f == {"predicted_outside_share": 1.0, "outside_share": pytest.approx(0.5)}
    assert "finds no entities" in diagnose("token_classification", f, 1e-4, 3).figure
    assert diagnose("token_classification", tagging_figures(truth, truth), 1e-4, 3) is None


def test_qa_has_no_collapse_test():
    assert diagnose("question_answering", {"eval_f1": 0.0}, 1e-4, 3) is None


def test_mlm_stuck_at_the_most_frequent_tokens_share():
    stuck = diagnose_mlm({"eval_mlm_accuracy": 0.066, "eval_mlm_top_token_share": 0.065}, 1e-4, 400)
    assert stuck is not None and "0.066" in stuck.figure and "0.065" in stuck.figure
    assert "--lr (this run: 0.0001)" in stuck.advice
    assert diagnose_mlm({"eval_mlm_accuracy": 0.226, "eval_mlm_top_token_share": 0.065}, 1e-3, 400) is None
    assert diagnose_mlm({"eval_mlm_accuracy": 0.05}, 1e-4, 400) is None  # no share: nothing to compare with
