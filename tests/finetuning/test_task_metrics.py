"""Fine-tuning metrics against hand-computed cases (no model, no Ray)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from finetuning.task_metrics import (
    classification_metrics,
    entity_metrics,
    normalize_answer,
    regression_metrics,
    squad_exact_match,
    squad_metrics,
    squad_token_f1,
)


def test_binary_classification_by_hand():
    y_true = [1, 1, 1, 0, 0, 0, 0, 1]
    y_pred = [1, 1, 0, 0, 0, 1, 0, 1]
    # TP=3 FN=1 FP=1 TN=3: accuracy 6/8, F1 of class 1 = 2*3/(2*3+1+1) = 0.75, MCC = (9-1)/sqrt(4*4*4*4) = 0.5
    m = classification_metrics(y_true, y_pred, 2)
    assert m["accuracy"] == pytest.approx(0.75)
    assert m["f1"] == pytest.approx(0.75)
    assert m["mcc"] == pytest.approx(0.5)
    assert m["f1_macro"] == pytest.approx(0.75)


def test_multiclass_macro_f1_by_hand():
    y_true = [0, 0, 1, 1, 2, 2]
    y_pred = [0, 1, 1, 1, 2, 0]
    # class 0: P=1/2 R=1/2 F=1/2; class 1: P=2/3 R=1 F=0.8; class 2: P=1 R=1/2 F=2/3
    m = classification_metrics(y_true, y_pred, 3)
    assert m["f1"] == m["f1_macro"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    assert m["accuracy"] == pytest.approx(4 / 6)


def test_regression_correlations():
    y = [1.0, 2.0, 3.0, 4.0]
    m = regression_metrics(y, [2.0, 4.0, 6.0, 8.0])
    assert m["pearson"] == pytest.approx(1.0) and m["spearman"] == pytest.approx(1.0)
    assert m["mse"] == pytest.approx((1 + 4 + 9 + 16) / 4)
    # Monotone but not linear: Spearman 1, Pearson below 1.
    m = regression_metrics(y, [1.0, 2.0, 3.0, 100.0])
    assert m["spearman"] == pytest.approx(1.0) and m["pearson"] < 0.9
    assert regression_metrics(y, [5.0] * 4)["pearson"] == 0.0  # constant prediction: no correlation, not NaN


def test_entity_f1_with_partial_matches():
    """conlleval: an entity counts only when type and both boundaries match; partial overlaps are errors."""
    y_true = [["B-PER", "I-PER", "O", "B-LOC", "O"], ["B-ORG", "I-ORG", "I-ORG", "O"]]
    y_pred = [["B-PER", "I-PER", "O", "B-ORG", "O"],   # PER exact; LOC predicted with the wrong type
              ["B-ORG", "I-ORG", "O", "O"]]            # ORG boundary cut short: wrong
    # gold entities 3, predicted 3, correct 1 -> P = R = F1 = 1/3
    m = entity_metrics(y_true, y_pred)
    assert m["precision"] == pytest.approx(1 / 3) and m["recall"] == pytest.approx(1 / 3)
    assert m["f1"] == pytest.approx(1 / 3)
    # An I- tag after O starts an entity (conlleval's lenient rule): I-PER I-PER == B-PER I-PER.
    assert entity_metrics([["B-PER", "I-PER"]], [["I-PER", "I-PER"]])["f1"] == pytest.approx(1.0)
    # One extra predicted entity: P = 1/2, R = 1, F1 = 2/3.
    m = entity_metrics([["B-PER", "O", "O"]], [["B-PER", "O", "B-LOC"]])
    assert (m["precision"], m["recall"]) == (pytest.approx(0.5), pytest.approx(1.0))
    assert m["f1"] == pytest.approx(2 / 3)


def test_squad_normalisation_and_scores():
    assert normalize_answer("  The  Quick, brown FOX!  ") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("theory") == "theory"  # articles only as whole words
    assert squad_exact_match("the Eiffel Tower.", "Eiffel tower") == 1.0
    # pred tokens [eiffel, tower, in, paris], gold [eiffel, tower] ("the" dropped): P=2/4, R=1, F1=2/3
    assert squad_token_f1("Eiffel Tower in Paris", "the Eiffel Tower") == pytest.approx(2 / 3)
    assert squad_token_f1("", "x") == 0.0
    m = squad_metrics(["Denver Broncos", "nope"], [["Broncos", "Denver Broncos"], ["yes"]])
    assert m["exact_match"] == pytest.approx(0.5) and m["f1"] == pytest.approx(0.5)
    assert not math.isnan(squad_metrics([], [])["f1"])
    assert np.isclose(squad_metrics(["a b c"], [["b c d"]])["f1"], 2 * (2 / 2) * (2 / 3) / (1 + 2 / 3))
