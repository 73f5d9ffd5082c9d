"""A collapsed model is named: the figures by hand, and the line that says what happened and what to try."""
from __future__ import annotations

import pytest

from training.collapse import (
    COLLAPSE_SHARE,
    classification_figures,
    diagnose,
    diagnose_mlm,
    mlm_check,
    regression_figures,
    tagging_figures,
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


def test_mlm_that_learnt_nothing_is_a_collapse_and_the_advice_is_the_default_rate():
    """--lr 1e-7: the loss never leaves where it started (ln 8192 = 9.01)."""
    stuck = diagnose_mlm({"eval_mlm_accuracy": 0.063, "eval_mlm_top_token_share": 0.063, "eval_mlm_loss": 9.00,
                          "eval_mlm_predicted_top_share": 0.02}, 1e-7, 400, default_lr=2e-3, start_loss=9.01)
    assert stuck is not None and stuck.collapsed
    assert "0.063" in stuck.figure and "no better than where it started (9.010)" in stuck.figure
    assert stuck.advice.startswith("try a higher --lr (this run: 1e-07): the default for this model's width is 0.002 "
                                   "(docs/learning-rates.md; leave --lr out to use it)")
    assert diagnose_mlm({"eval_mlm_accuracy": 0.226, "eval_mlm_top_token_share": 0.065}, 1e-3, 400) is None
    assert diagnose_mlm({"eval_mlm_accuracy": 0.05}, 1e-4, 400) is None  # no share: nothing to compare with


def test_mlm_predicting_one_token_everywhere_is_a_collapse_and_a_rate_far_above_the_default_is_named():
    found = diagnose_mlm({"eval_mlm_accuracy": 0.064, "eval_mlm_top_token_share": 0.064, "eval_mlm_loss": 6.9,
                          "eval_mlm_predicted_top_share": 0.998}, 0.03, 400, default_lr=2e-3, start_loss=9.0)
    assert found is not None and found.collapsed and "it predicts one token for 99.8% of them" in found.figure
    assert "try a lower --lr (this run: 0.03): the default for this model's width is 0.002" in found.advice


def test_one_token_everywhere_early_at_the_default_rate_is_the_first_stage_not_a_collapse():
    """Six steps of 8 at the default rate (3k tokens): one token for 99% of the masked positions and the loss falling
    (issue 34: this was a WARNING). The same model at 15x the default rate, or after 2M tokens, is a collapse."""
    seen = {"eval_mlm_accuracy": 0.032, "eval_mlm_top_token_share": 0.035, "eval_mlm_loss": 6.18,
            "eval_mlm_predicted_top_share": 0.99}
    note = diagnose_mlm(seen, 2e-3, 6, default_lr=2e-3, start_loss=6.39, tokens=3_000)
    assert note is not None and not note.collapsed
    assert "as every MLM run does at first" in note.figure and "train longer" in note.advice
    assert diagnose_mlm(seen, 3e-2, 6, default_lr=2e-3, start_loss=6.39, tokens=3_000).collapsed
    assert diagnose_mlm(seen, 2e-3, 600, default_lr=2e-3, start_loss=6.39, tokens=2_000_000).collapsed
    # early, but the loss did not move: a rate too low to learn is still named
    stuck = diagnose_mlm(seen | {"eval_mlm_loss": 6.38}, 1e-7, 6, default_lr=2e-3, start_loss=6.39, tokens=3_000)
    assert stuck.collapsed and "no better than where it started" in stuck.figure


@pytest.mark.parametrize("acc, share, loss, top", [(0.072, 0.063, 7.49, 0.41),   # issue 34's 400-step news run
                                                   (0.033, 0.035, 7.80, 0.30)])  # its 3-minute workflow run
def test_mlm_near_the_baseline_but_learning_is_not_a_collapse(acc, share, loss, top):
    """At the default rate, 400 steps of 32: accuracy near the top token's share, the loss well down from 9.30,
    predictions spread over many tokens. Not a collapse (those models fine-tune well): a note to train longer,
    never 'try a higher --lr' (docs/learning-rates.md measured the default, 2e-3, best)."""
    note = diagnose_mlm({"eval_mlm_accuracy": acc, "eval_mlm_top_token_share": share, "eval_mlm_loss": loss,
                         "eval_mlm_predicted_top_share": top}, 2e-3, 400, default_lr=2e-3, start_loss=9.30,
                        tokens=1_600_000)
    assert note is not None and not note.collapsed
    assert note.message.startswith("not a collapse: held-out MLM accuracy") and "after 1.6M tokens" in note.message
    assert "(MLM loss 9.30 -> " in note.message and "train longer" in note.advice
    assert "collapsed model" not in note.message and "higher --lr" not in note.message


def test_mlm_check_reads_where_the_run_started_and_its_tokens_from_what_it_logged():
    note = mlm_check({"eval_mlm_accuracy": 0.072, "eval_mlm_top_token_share": 0.063, "eval_mlm_loss": 7.49},
                     [(50, 9.30), (100, 8.6), (400, 7.5)], lr=2e-3, default_lr=2e-3, max_steps=400,
                     sequences_per_step=32, seq_len_histogram=((100, 1), (128, 3), (130, 1)))
    assert not note.collapsed and "after 1.6M tokens" in note.message  # 400 x 32 x 122.8 tokens
    assert "(MLM loss 9.30 -> 7.49)" in note.message


def test_fine_tuning_advice_follows_the_measured_defaults():
    one_class = {"eval_predicted_top_share": 1.0, "eval_majority_share": 0.5, "eval_accuracy": 0.5}
    low = diagnose("classification", one_class, 1e-7, 3, default_lr=1e-3)
    assert "try a higher --lr (this run: 1e-07): the default for this model's width is 0.001" in low.advice
    high = diagnose("classification", one_class, 3e-2, 3, default_lr=1e-3)
    assert "try a lower --lr (this run: 0.03)" in high.advice and "higher" not in high.message
    at = diagnose("classification", one_class, 1e-3, 3, default_lr=1e-3)
    assert "keep --lr (this run: 0.001, this model's default" in at.advice and "--epochs (this run: 3)" in at.advice
    assert "higher --lr" not in at.message
