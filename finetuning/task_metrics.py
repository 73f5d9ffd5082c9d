"""Evaluation metrics as the benchmarks report them, from the maintained libraries where they exist.

- classification: accuracy, F1 (binary for two classes, positive class id 1; macro otherwise, plus macro always),
  Matthews correlation (scikit-learn);
- regression: Pearson and Spearman correlation (scipy), mean squared error;
- tagging: entity-level precision/recall/F1 with seqeval's default (conlleval) rules;
- QA: SQuAD v1.1 exact match and token F1 with the official answer normalisation, maximised over gold answers
  (the official script's formulas: no maintained library in our stack ships them).
All values are fractions in [0, 1] (SQuAD's script prints them x100).
"""
from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

import numpy as np


def classification_metrics(y_true: Sequence[int], y_pred: Sequence[int], num_labels: int) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    labels = list(range(num_labels))
    out = {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "f1_macro": float(f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
        "mcc": float(matthews_corrcoef(y_true, y_pred)),
    }
    # GLUE's binary F1 is for the positive class (label id 1); with more classes "f1" is the macro average.
    out["f1"] = (float(f1_score(y_true, y_pred, pos_label=1, average="binary", zero_division=0))
                 if num_labels == 2 else out["f1_macro"])
    return out


def regression_metrics(y_true: Sequence[float], y_pred: Sequence[float]) -> dict[str, float]:
    from scipy.stats import pearsonr, spearmanr

    y_true, y_pred = np.asarray(y_true, dtype=np.float64), np.asarray(y_pred, dtype=np.float64)
    constant = np.ptp(y_pred) == 0 or np.ptp(y_true) == 0
    # A constant prediction (an untrained model can give one) has no correlation: report 0, not NaN.
    pearson = 0.0 if constant else float(pearsonr(y_true, y_pred)[0])
    spearman = 0.0 if constant else float(spearmanr(y_true, y_pred)[0])
    return {"pearson": pearson, "spearman": spearman, "mse": float(np.mean((y_true - y_pred) ** 2))}


def entity_metrics(y_true: list[list[str]], y_pred: list[list[str]]) -> dict[str, float]:
    """Entity-level scores: an entity counts only if its type and both boundaries match (conlleval)."""
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    return {
        "precision": float(precision_score(y_true, y_pred, zero_division=0)),
        "recall": float(recall_score(y_true, y_pred, zero_division=0)),
        "f1": float(f1_score(y_true, y_pred, zero_division=0)),
        "token_accuracy": float(accuracy_score(y_true, y_pred)),
    }


def normalize_answer(s: str) -> str:
    """The official SQuAD v1.1 normalisation: lowercase, drop punctuation, drop articles, squeeze whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def squad_exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def squad_token_f1(prediction: str, truth: str) -> float:
    pred, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    common = Counter(pred) & Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def squad_metrics(predictions: Sequence[str], gold_answers: Sequence[Sequence[str]]) -> dict[str, float]:
    """Mean over questions of the best score against any gold answer (SQuAD dev has several per question)."""
    if len(predictions) != len(gold_answers):
        raise ValueError(f"{len(predictions)} predictions for {len(gold_answers)} questions")
    em = [max(squad_exact_match(p, g) for g in golds) for p, golds in zip(predictions, gold_answers, strict=False)]
    f1 = [max(squad_token_f1(p, g) for g in golds) for p, golds in zip(predictions, gold_answers, strict=False)]
    n = max(len(em), 1)
    return {"exact_match": sum(em) / n, "f1": sum(f1) / n}
