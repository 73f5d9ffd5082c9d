"""What a fine-tuning run learns from (`TaskConfig`: the task, its files, the split, columns and feature lengths),
and one call from those files to everything training and evaluation need, with every check done up front.

``prepare`` reads the files (``finetuning.records``), splits and subsamples them with a fixed seed, then
``prepare_task`` validates columns and labels of *both* splits (so a bad evaluation file fails before any
training), builds the label map from the training split, and featurises both splits with the model's vocabulary.
It is deterministic: the job's driver runs it first to check everything, and every worker gets the same result.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from finetuning.examples import (
    TASKS,
    LabelMap,
    QAExample,
    SequenceExample,
    TaggingExample,
    TaskColumns,
    qa_examples,
    sequence_examples,
    tagging_examples,
)
from finetuning.features import Features, TaskTokenizer, sequence_features, tagging_features
from finetuning.qa import QAWindows, qa_features
from finetuning.records import FORMATS, read_records, split_train_eval, subsample

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeatureConfig:
    max_seq_length: int = 128
    """Word pieces per sequence, [CLS] and [SEP] included; at most 512, BERT's position table. 128 is the reference
    run_classifier.py's default."""
    doc_stride: int = 64
    """QA: word pieces between the starts of consecutive windows over a long passage (the reference's run_squad.py:
    128 at a sequence length of 384)."""
    max_query_length: int = 64
    """QA: a question's word pieces past this many are cut; 64, as in the reference run_squad.py."""

    def __post_init__(self) -> None:
        if not 8 <= self.max_seq_length <= 512:
            raise ValueError(f"max_seq_length must be in [8, 512] (BERT's position table), got {self.max_seq_length}")
        if self.doc_stride <= 0 or self.max_query_length <= 0:
            raise ValueError("doc_stride and max_query_length must be positive")


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """The task and its data: files (any fsspec URL), the evaluation split, the columns and the feature lengths."""

    task: str
    """One of `finetuning.examples.TASKS`; it picks the columns read, the head and the metrics."""
    train: str
    """The training file, any fsspec URL, in one of `corpus.records.FORMATS` (a SQuAD v1.1 JSON file is flattened to
    one record per question)."""
    eval: str | None = None
    """The evaluation file; give it or `split_eval_from_train`, not both."""
    split_eval_from_train: float | None = None
    """Hold out this seeded fraction of `train` for evaluation (tasks shipped without a split)."""
    data_format: str | None = None
    """One of `corpus.records.FORMATS`, for both files; None: detected from each file's name."""
    split_seed: int = 0
    """Seed of the held-out split and of the `max_*_examples` subsets, apart from the run's seed: runs with different
    seeds train and score on the same rows."""
    max_train_examples: int | None = None
    """Train on a seeded subset of this many records (quick runs); None: all of them."""
    max_eval_examples: int | None = None
    """Evaluate on a seeded subset of this many records; None: all of them."""
    columns: TaskColumns = TaskColumns()
    """Which record fields hold the inputs and the labels."""
    features: FeatureConfig = FeatureConfig()
    """Sequence length and QA windows, in word pieces."""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"--task {self.task!r}: use one of {', '.join(TASKS)}")
        if (self.eval is None) == (self.split_eval_from_train is None):
            raise ValueError("give exactly one of --eval URL or --split-eval-from-train FRACTION (e.g. 0.1)")
        if self.data_format is not None and self.data_format not in FORMATS:
            raise ValueError(f"--data-format {self.data_format!r}: use one of {', '.join(FORMATS)}")
        for name in ("max_train_examples", "max_eval_examples"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")


@dataclass
class TaskSplit:
    """One split: its examples, model features, and what maps feature rows back to examples for scoring."""

    source: str
    """The split's file as messages name it (a held-out part says so, with its fraction and seed)."""
    examples: list
    """One example per record, its type the task's; scoring reads the gold labels and answers here."""
    features: Features
    """The model's rows: one per example, or one per window for QA."""
    word_positions: list[np.ndarray] | None = None
    """Tagging: per row, the word index of each labelled position, to map predictions back to words."""
    windows: QAWindows | None = None
    """QA: each window's example and where its passage piece sits, to map predicted spans back to text."""

    @property
    def num_examples(self) -> int:
        return len(self.examples)


@dataclass
class PreparedTask:
    task: str
    """The task (`finetuning.examples.TASKS`)."""
    label_map: LabelMap | None
    """Built from the training split only; None for regression and QA."""
    train: TaskSplit
    """The training split, checked and featurised."""
    eval: TaskSplit
    """The evaluation split, checked against the training labels and featurised."""

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
    """The training split's labels; every other split is checked against them: an unseen class label is a clear
    error, an unseen tag a warning (its tokens are scored as errors)."""
    if task in ("regression", "question_answering"):
        return None
    if task == "token_classification":
        label_map = LabelMap.build((t for e in train for t in e.tags), outside_first=True)
        for exs, src in others:
            # A tag training never saw (one `UH` in a dev split) cannot be predicted: its tokens are scored as the
            # errors they are, with one warning, rather than the evaluation refused.
            unseen = label_map.unseen(t for e in exs for t in e.tags)
            if unseen:
                log.warning("tag(s) %s in %s never occur in the training data %s: the model has no output for them, "
                            "so those %d token(s) are scored as errors", ", ".join(
                                f"{k!r} ({n} token{'s' if n > 1 else ''})" for k, n in unseen.most_common(10)),
                            src, train_source, sum(unseen.values()))
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


def prepare(cfg: TaskConfig, tokenizer: TaskTokenizer) -> PreparedTask:
    """Read, split, subsample and featurise the task's files (`prepare_task` does the checks)."""
    train = read_records(cfg.train, cfg.data_format)
    if cfg.split_eval_from_train is not None:
        train, evals = split_train_eval(train, cfg.split_eval_from_train, cfg.split_seed)
        train_src = f"{cfg.train} (train part of a seeded {1 - cfg.split_eval_from_train:.0%} split)"
        eval_src = f"{cfg.train} (held-out {cfg.split_eval_from_train:.0%}, split seed {cfg.split_seed})"
    else:
        evals = read_records(cfg.eval, cfg.data_format)
        train_src, eval_src = cfg.train, cfg.eval
    train = subsample(train, cfg.max_train_examples, cfg.split_seed)
    evals = subsample(evals, cfg.max_eval_examples, cfg.split_seed)
    return prepare_task(cfg.task, train, evals, cfg.columns, tokenizer, cfg.features, train_src, eval_src)
