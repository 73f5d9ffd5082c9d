"""A collapsed model, named: a classifier that predicts one class (or nearly: >= 95% of the evaluation set), or
whose predictions carry no information (accuracy at the majority share, MCC ~0), a regressor that predicts a
near-constant, a tagger that predicts only the outside tag. `figures` measures it on the evaluation set (numbers
that go to MLflow with the epoch's metrics); `diagnose` turns the best epoch's figures into one line saying what
happened and what to try. A collapsed model can still score the majority share of accuracy, which looks like
learning on an unbalanced task: the figure beside it tells the two apart.

Pre-training (`diagnose_mlm`) tells a collapse (one token predicted everywhere past the first million tokens or at
a rate far above the default, or a loss no better than where the run started) from a model that is learning but
still near the most frequent token's share after few tokens (predicting that one token everywhere, as every MLM run
does at first, included): the first is a WARNING, the second a note (`Collapse.collapsed` False) that says to train
longer. The advice follows docs/learning-rates.md: a rate below the measured default is told to use it, one far
above to come down to it.
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
    figure: str
    """What the model does, with its number; also the run's MLflow tag `collapse`."""
    advice: str
    """What to try, in the flags' words."""
    collapsed: bool = True
    """False: not a collapse but a model still near its baseline (a note, not a warning)."""

    @property
    def message(self) -> str:
        return f"collapsed model: {self.figure}; {self.advice}" if self.collapsed else f"{self.figure}: {self.advice}"


# Where a rate counts as "far above" the default: the sweeps' next grid point past the best (3e-3 vs 1e-3 in
# fine-tuning, where rt_sentiment collapsed again) is 3x.
FAR_ABOVE = 2.5


def lr_advice(lr: float, default_lr: float | None) -> str:
    """What docs/learning-rates.md says of this run's rate, as the first thing to try."""
    if default_lr is None:
        return f"try another --lr (this run: {lr:g}; docs/learning-rates.md)"
    default = f"the default for this model's width is {default_lr:g} (docs/learning-rates.md; leave --lr out to use it)"
    if lr < default_lr / 1.5:
        return f"try a higher --lr (this run: {lr:g}): {default}"
    if lr > FAR_ABOVE * default_lr:
        return f"try a lower --lr (this run: {lr:g}): {default}"
    return f"keep --lr (this run: {lr:g}, this model's default: docs/learning-rates.md)"


def diagnose(task: str, metrics: Mapping[str, float], lr: float, epochs: int,
             default_lr: float | None = None) -> Collapse | None:
    """A collapse in the (eval_-prefixed or bare) figures, with what to try (`default_lr`: the default rate for the
    model's width, which the advice compares this run's with); None for a model that is not collapsed (or a task
    without a collapse test: QA)."""
    def get(key: str) -> float | None:
        value = metrics.get(f"eval_{key}", metrics.get(key))
        return None if value is None else float(value)

    if default_lr is None:
        advice = (f"try a higher --lr (this run: {lr:g}), more --epochs (this run: {epochs}), or a longer "
                  "pre-training")
    else:
        advice = f"{lr_advice(lr, default_lr)}; more --epochs (this run: {epochs}) or a longer pre-training may help"
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


# Held-out MLM accuracy within this factor of the most frequent token's share: near the frequency baseline (a model
# that predicts that one token everywhere scores exactly the share). A bert_tiny pre-trained 400 steps of 32 at the
# default rate reached 1.66x on Austen and Moby Dick (docs/learning-rates.md); another corpus read 1.14x after as
# many steps, a model that fine-tunes well: near the baseline after few tokens is not, by itself, a collapse.
MLM_STUCK_FACTOR = 1.25
# A collapse: the model predicts one token for this share of the masked positions (its predictions carry no
# information), or its MLM loss fell less than this fraction below where the run started.
MLM_ONE_TOKEN_SHARE = 0.95
MLM_MIN_LOSS_DROP = 0.03
# Every MLM run first predicts the most frequent token everywhere (the loss falls from ln(vocab) towards the
# tokens' unigram entropy) and only then learns from context. Before this many tokens a one-token model at a rate
# not far above the default is in that stage, not collapsed: a bert_tiny at the default rate still predicted one
# token for 100% of the masked positions after 40 steps of 8 (20k tokens; its held-out loss falling 6.34 -> 5.84)
# and had left the stage by 400 steps of 32 (1.6M tokens, 1.66x the share; docs/learning-rates.md), 2026-11-28.
MLM_EARLY_TOKENS = 1_000_000
# Over so few tokens the loss falls little: in that stage "no better than where it started" is a fall under 1%.
MLM_MIN_LOSS_DROP_EARLY = 0.01


def diagnose_mlm(metrics: Mapping[str, float], lr: float, steps: int, *, default_lr: float | None = None,
                 start_loss: float | None = None, tokens: int | None = None) -> Collapse | None:
    """Pre-training's check, on the last evaluation: None when held-out MLM accuracy is well past the most
    frequent token's share (or there is no share to compare with); else a collapse (one token predicted
    everywhere, or `start_loss`, the MLM loss where the run started, barely bettered) with the rate's advice, or
    a note that the model is learning but has seen few `tokens` yet."""
    acc, share = metrics.get("eval_mlm_accuracy"), metrics.get("eval_mlm_top_token_share")
    if acc is None or share is None or not acc == acc or acc > MLM_STUCK_FACTOR * share:
        return None
    near = (f"held-out MLM accuracy {acc:.3f} is {'near' if acc > share else 'no better than'} the most frequent "
            f"token's share of the masked tokens ({share:.3f})")
    one = metrics.get("eval_mlm_predicted_top_share")
    loss = metrics.get("eval_mlm_loss", metrics.get("mlm_loss"))
    early = (tokens is not None and tokens < MLM_EARLY_TOKENS
             and (default_lr is None or lr <= FAR_ABOVE * default_lr))
    one_token = one is not None and one >= MLM_ONE_TOKEN_SHARE
    if one_token and not early:
        return Collapse(f"{near}: it predicts one token for {one:.1%} of them",
                        f"{lr_advice(lr, default_lr)}; warm-up on (--warmup-steps) or more --max-steps (this run: "
                        f"{steps}) if the rate is already the default")
    min_drop = MLM_MIN_LOSS_DROP_EARLY if early else MLM_MIN_LOSS_DROP
    if start_loss is not None and loss is not None and loss > (1 - min_drop) * start_loss:
        return Collapse(f"{near}, and its MLM loss {loss:.3f} is no better than where it started ({start_loss:.3f})",
                        f"{lr_advice(lr, default_lr)}; warm-up on (--warmup-steps) or more --max-steps (this run: "
                        f"{steps}) if the rate is already the default")
    fell = f" (MLM loss {start_loss:.2f} -> {loss:.2f})" if start_loss is not None and loss is not None else ""
    seen = f" after {tokens / 1e6:.1f}M tokens" if tokens else f" after {steps} steps"
    stage = (f", predicting the most frequent token for {one:.1%} of them as every MLM run does at first"
             if one_token else "")
    return Collapse(f"not a collapse: {near}{seen}{stage}, but it is learning{fell}",
                    "train longer (more --max-steps, or --max-minutes if a budget stopped it) to go past it; "
                    "docs/learning-rates.md has what 400 steps of 32 sequences reach", collapsed=False)


def mlm_check(metrics: Mapping[str, float], losses: list[tuple[int, float]], *, lr: float, default_lr: float,
              max_steps: int, sequences_per_step: int, seq_len_histogram) -> Collapse | None:
    """`diagnose_mlm` for a pre-training run from what it logged: `losses` its (step, MLM loss) points (the first:
    where it started; the last step: how far it went), the dataset's (length, rows) histogram for its tokens."""
    rows = sum(r for _, r in seq_len_histogram)
    mean_length = sum(n * r for n, r in seq_len_histogram) / rows if rows else 0
    steps = losses[-1][0] if losses else max_steps
    return diagnose_mlm(metrics, lr, max_steps, default_lr=default_lr, start_loss=losses[0][1] if losses else None,
                        tokens=int(steps * sequences_per_step * mean_length) or None)
