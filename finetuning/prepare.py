"""One call from records to everything training and evaluation need, with every check done up front.

``prepare_task`` validates columns and labels of *both* splits (so a bad evaluation file fails before any
training), builds the label map from the training split, and featurises both splits with the model's vocabulary.
The result is plain data (numpy arrays, lists, small dataclasses) that pickles into Ray's object store.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from finetuning.examples import (
    LabelMap, QAExample, SequenceExample, TaggingExample, TaskColumns, TASKS, qa_examples, sequence_examples,
    tagging_examples,
)
from finetuning.features import Features, TaskTokenizer, sequence_features, tagging_features
from finetuning.qa import QAWindows, qa_features

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeatureConfig:
    max_seq_length: int = 128
    doc_stride: int = 64
    max_query_length: int = 64

    def __post_init__(self) -> None:
        if not 8 <= self.max_seq_length <= 512:
            raise ValueError(f"max_seq_length must be in [8, 512] (BERT's position table), got {self.max_seq_length}")
        if self.doc_stride <= 0 or self.max_query_length <= 0:
            raise ValueError("doc_stride and max_query_length must be positive")


@dataclass
class TaskSplit:
    """One split: its examples, model features, and what maps feature rows back to examples for scoring."""

    source: str
    examples: list
    features: Features
    word_positions: list[np.ndarray] | None = None  # tagging: word index of each labelled position per row
    windows: QAWindows | None = None  # QA: window -> example, offsets

    @property
    def num_examples(self) -> int:
        return len(self.examples)


@dataclass
class PreparedTask:
    task: str
    label_map: LabelMap | None  # None for regression and QA
    train: TaskSplit
    eval: TaskSplit

    @property
    def num_labels(self) -> int:
        if self.task == "regression":
            return 1
        if self.task == "question_answering":
            return 2
        return len(self.label_map)


def load_examples(task: str, records: list[dict], columns: TaskColumns,
                  source: str) -> list[SequenceExample] | list[TaggingExample] | list[QAExample]:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; use one of {', '.join(TASKS)}")
    if task == "token_classification":
        return tagging_examples(records, columns, source)
    if task == "question_answering":
        return qa_examples(records, columns, source)
    return sequence_examples(records, task, columns, source)


def build_label_map(task: str, train: list, train_source: str, others: list[tuple[list, str]]) -> LabelMap | None:
    """The training split's labels; every other split is checked against them (unseen label -> clear error)."""
    if task in ("regression", "question_answering"):
        return None
    if task == "token_classification":
        label_map = LabelMap.build((t for e in train for t in e.tags), outside_first=True)
        for exs, src in others:
            label_map.check((t for e in exs for t in e.tags), src, train_source)
    else:
        label_map = LabelMap.build(e.label for e in train)
        if len(label_map) < 2:
            raise ValueError(f"{train_source} has a single label {label_map.names[0]!r}; classification needs >= 2")
        for exs, src in others:
            label_map.check((e.label for e in exs), src, train_source)
    return label_map


def featurize(task: str, examples: list, source: str, tokenizer: TaskTokenizer, cfg: FeatureConfig,
              label_map: LabelMap | None, training: bool) -> TaskSplit:
    if task == "token_classification":
        feats, words = tagging_features(examples, tokenizer, cfg.max_seq_length, label_map)
        return TaskSplit(source, examples, feats, word_positions=words)
    if task == "question_answering":
        feats, windows = qa_features(examples, tokenizer, cfg.max_seq_length, cfg.doc_stride, cfg.max_query_length,
                                     training=training)
        if training and len(feats) == 0:
            raise ValueError(f"{source}: no usable QA training example (answer_text must appear at answer_start)")
        return TaskSplit(source, examples, feats, windows=windows)
    feats = sequence_features(examples, tokenizer, cfg.max_seq_length, None if task == "regression" else label_map)
    return TaskSplit(source, examples, feats)


def prepare_task(task: str, train_records: list[dict], eval_records: list[dict], columns: TaskColumns,
                 tokenizer: TaskTokenizer, cfg: FeatureConfig, train_source: str, eval_source: str) -> PreparedTask:
    train = load_examples(task, train_records, columns, train_source)
    evals = load_examples(task, eval_records, columns, eval_source)
    label_map = build_label_map(task, train, train_source, [(evals, eval_source)])
    prepared = PreparedTask(
        task, label_map,
        featurize(task, train, train_source, tokenizer, cfg, label_map, training=True),
        featurize(task, evals, eval_source, tokenizer, cfg, label_map, training=False),
    )
    log.info("%s: %d train examples (%d feature rows), %d eval examples (%d feature rows)%s", task,
             len(train), len(prepared.train.features), len(evals), len(prepared.eval.features),
             f", labels {list(label_map.names)[:20]}" if label_map else "")
    return prepared
