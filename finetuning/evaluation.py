"""Model outputs (numpy, one entry per feature row) -> the task's metrics. No model here: the job runs the model
and hands over per-row outputs, so this is unit-testable with hand-made logits. Beside the task's metrics, the
figures that tell a collapsed model (`finetuning.collapse`): the most predicted class's share, the predictions'
spread, the share of words tagged outside."""
from __future__ import annotations

import numpy as np

from finetuning.examples import LabelMap
from finetuning.features import words_to_tags
from finetuning.prepare import TaskSplit
from finetuning.qa import best_answers
from finetuning.task_metrics import classification_metrics, entity_metrics, regression_metrics, squad_metrics
from training.collapse import classification_figures, regression_figures, tagging_figures

# The metric that picks the best epoch's model (and the first figure a benchmark quotes).
MAIN_METRIC = {
    "classification": "accuracy",
    "pair_classification": "accuracy",
    "regression": "pearson",
    "token_classification": "f1",
    "question_answering": "f1",
}


def score(task: str, split: TaskSplit, label_map: LabelMap | None, outputs: list,
          max_answer_length: int = 30) -> dict[str, float]:
    """``outputs[i]`` is row i's logits: (C,) for sequences, (1,) for regression, (T_i, C) for tagging,
    (T_i, 2) start/end for QA (T_i = the row's unpadded length)."""
    feats = split.features
    if len(outputs) != len(feats):
        raise ValueError(f"{len(outputs)} outputs for {len(feats)} feature rows")
    if task == "regression":
        preds = np.asarray([float(o.reshape(-1)[0]) for o in outputs])
        return regression_metrics(feats.labels, preds) | regression_figures(feats.labels, preds)
    if task in ("classification", "pair_classification"):
        preds = np.asarray([int(np.argmax(o)) for o in outputs])
        return classification_metrics(feats.labels, preds, len(label_map)) | classification_figures(feats.labels, preds)
    if task == "token_classification":
        y_true, y_pred = [], []
        for i, ex in enumerate(split.examples):
            pred_ids = np.argmax(outputs[i], axis=-1)
            y_pred.append(words_to_tags(pred_ids, feats.labels[i], split.word_positions[i], len(ex.tokens), label_map))
            y_true.append(ex.tags)
        return entity_metrics(y_true, y_pred) | tagging_figures(y_true, y_pred)
    if task == "question_answering":
        starts = [o[:, 0] for o in outputs]
        ends = [o[:, 1] for o in outputs]
        preds = best_answers(split.examples, split.windows, starts, ends, max_answer_length)
        return squad_metrics(preds, [[t for _, t in ex.answers] for ex in split.examples])
    raise ValueError(f"unknown task {task!r}")
