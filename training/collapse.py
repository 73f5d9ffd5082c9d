"""A collapsed model, named: a classifier that predicts one class (or nearly: >= 95% of the evaluation set), or
whose predictions carry no information (accuracy at the majority share, MCC ~0), a regressor that predicts a
near-constant, a tagger that predicts only the outside tag. `figures` measures it on the evaluation set (numbers
that go to MLflow with the epoch's metrics); `diagnose` turns the best epoch's figures into one line saying what
happened and what to try. A collapsed model can still score the majority share of accuracy, which looks like
learning on an unbalanced task: the figure beside it tells the two apart.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# A classifier whose most predicted class covers this share of the evaluation set has (nearly) stopped looking at
# its input. 95%: a real model on the most unbalanced shared task (wordnet_wic, 89.5% one class) stays below it.
COLLAPSE_SHARE = 0.95
# Or a classifier spread over several classes whose accuracy is within this margin of the majority share with a
# Matthews correlation this close to 0: its predictions carry no information about the labels.
NO_BETTER_MARGIN = 0.01
NO_BETTER_MCC = 0.05
# A regressor whose predictions spread less than this fraction of the labels' spread predicts a near-constant.
COLLAPSE_SPREAD = 0.05
OUTSIDE = "O"


def classification_figures(y_true: Sequence[int], y_pred: Sequence[int]) -> dict[str, float]:
    """The most predicted class's share of the predictions, and the majority class's share of the labels."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    return {"predicted_top_share": float(np.bincount(y_pred).max() / len(y_pred)),
            "majority_share": float(np.bincount(y_true).max() / len(y_true))}


def regression_figures(y_true: Sequence[float], y_pred: Sequence[float]) -> dict[str, float]:
    """The predictions' standard deviation over the labels' (0: a constant)."""
    spread = float(np.std(np.asarray(y_true, dtype=np.float64)))
    return {"prediction_spread": float(np.std(np.asarray(y_pred, dtype=np.float64))) / spread if spread else 0.0}


def tagging_figures(y_true: list[list[str]], y_pred: list[list[str]]) -> dict[str, float]:
    """The share of words tagged outside (O), predicted and true."""
    pred = [t for s in y_pred for t in s]
    true = [t for s in y_true for t in s]
    return {"predicted_outside_share": sum(t == OUTSIDE for t in pred) / max(1, len(pred)),
            "outside_share": sum(t == OUTSIDE for t in true) / max(1, len(true))}


@dataclass(frozen=True)
class Collapse:
    figure: str  # what the model does, with its number: the MLflow tag `collapse`
    advice: str  # what to try

    @property
    def message(self) -> str:
        return f"collapsed model: {self.figure}; {self.advice}"


def diagnose(task: str, metrics: Mapping[str, float], lr: float, epochs: int) -> Collapse | None:
    """A collapse in the (eval_-prefixed or bare) figures, with what to try; None for a model that is not
    collapsed (or a task without a collapse test: QA)."""
    def get(key: str) -> float | None:
        value = metrics.get(f"eval_{key}", metrics.get(key))
        return None if value is None else float(value)

    advice = (f"try a higher --lr (this run: {lr:g}), more --epochs (this run: {epochs}), or a longer "
              "pre-training")
    top, majority = get("predicted_top_share"), get("majority_share")
    if task in ("classification", "pair_classification") and top is not None and top >= COLLAPSE_SHARE:
        return Collapse(f"predicts one class for {top:.1%} of the evaluation set (the majority class is "
                        f"{majority:.1%} of its labels), so its accuracy is no sign of learning", advice)
    accuracy, mcc = get("accuracy"), get("mcc")
    if (task in ("classification", "pair_classification") and None not in (accuracy, mcc, majority)
            and accuracy <= majority + NO_BETTER_MARGIN and abs(mcc) <= NO_BETTER_MCC):
        # Not one class, but no signal either: its predictions are as good as a constant's (an untrained head).
        return Collapse(f"does no better than always predicting the majority class (accuracy {accuracy:.3f} vs the "
                        f"majority's {majority:.3f}, MCC {mcc:.3f})", advice)
    spread = get("prediction_spread")
    if task == "regression" and spread is not None and spread < COLLAPSE_SPREAD:
        return Collapse(f"predicts a near-constant (its predictions spread {spread:.1%} of the labels' standard "
                        "deviation)", advice)
    outside, true_outside = get("predicted_outside_share"), get("outside_share")
    if task == "token_classification" and outside is not None and outside >= 0.995 and (true_outside or 1) < 0.995:
        return Collapse(f"tags {outside:.1%} of the words outside (O) where the labels have {true_outside:.1%}: it "
                        "finds no entities", advice)
    return None


# Held-out MLM accuracy within this factor of the most frequent token's share: the model predicts (about) that one
# token everywhere. A bert_tiny pre-trained 400 steps at a working rate reaches several times the share
# (docs/learning-rates.md).
MLM_STUCK_FACTOR = 1.25


def diagnose_mlm(metrics: Mapping[str, float], lr: float, steps: int) -> Collapse | None:
    """Pre-training's collapse: held-out MLM accuracy stuck at the most frequent token's share."""
    acc, share = metrics.get("eval_mlm_accuracy"), metrics.get("eval_mlm_top_token_share")
    if acc is None or share is None or not acc == acc or acc > MLM_STUCK_FACTOR * share:
        return None
    return Collapse(f"held-out MLM accuracy {acc:.3f} is no better than always predicting the most frequent token "
                    f"({share:.3f} of the masked tokens)",
                    f"try a higher --lr (this run: {lr:g}), warm-up, or more --max-steps (this run: {steps})")
