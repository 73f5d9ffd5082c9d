"""Task records -> typed examples, with the column checks and label maps that must fail *before* training.

One extraction per task family. A missing column names the column, the file and the columns that are there; a
label in an evaluation file that training never saw names the label and both files. Label maps are built from
the training data only, in a stable order (numeric labels numerically, "O" first for tags), and travel with the
model as ``config.json``'s ``id2label``/``label2id``.
"""
from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

TASKS = ("classification", "pair_classification", "regression", "token_classification", "question_answering")


@dataclass(frozen=True)
class TaskColumns:
    """Which record fields hold the inputs; ``None`` text columns take the task's conventional default."""

    text_column: str | None = None
    """The text of sequence tasks; None: "sentence1" for pair_classification, else "text"."""
    text_pair_column: str | None = None
    """The second text: pair_classification's (None: "sentence2"), or an optional one for regression; refused with
    classification."""
    label_column: str = "label"
    """Each record's class, or its number for regression."""
    tokens_column: str = "tokens"
    """Token tagging: each sentence's list of words ("tokens", what the CoNLL reader writes)."""
    tags_column: str = "tags"
    """Token tagging: one tag per word, as many as the words ("tags", what the CoNLL reader writes)."""
    context_column: str = "context"
    """QA: the passage an answer is sliced from ("context", as in flattened SQuAD)."""
    question_column: str = "question"
    """QA: the question ("question", as in flattened SQuAD)."""
    answer_start_column: str = "answer_start"
    """QA, flat records: the answer's character offset in the passage. Unused when the records carry SQuAD's
    `answers` list."""
    answer_text_column: str = "answer_text"
    """QA, flat records: the answer's text, which must stand at `answer_start` (training drops a record where it does
    not)."""

    def texts_for(self, task: str) -> tuple[str, str | None]:
        if task == "pair_classification":
            return self.text_column or "sentence1", self.text_pair_column or "sentence2"
        if self.text_pair_column and task == "classification":
            raise ValueError("--text-pair-column is set but --task is classification; use --task pair_classification")
        return self.text_column or "text", self.text_pair_column if task == "regression" else None


@dataclass(frozen=True)
class SequenceExample:
    text: str
    """The first (or only) text."""
    text_pair: str | None
    """The second text of a pair; None for single-text tasks."""
    label: Any
    """The label as read (classification: compared by name, so 1 and "1" are one class) or a float (regression)."""


@dataclass(frozen=True)
class TaggingExample:
    tokens: list[str]
    """The sentence's words, already split: tags belong to words, not word pieces."""
    tags: list[str]
    """One tag per word; the training split's tags make the label map, "O" first."""


@dataclass(frozen=True)
class QAExample:
    id: str
    """The record's `id` (SQuAD's question id), else its row number as text."""
    context: str
    """The passage; a predicted answer is an exact slice of it."""
    question: str
    """The question, cut to `FeatureConfig.max_query_length` word pieces in the features."""
    answers: list[tuple[int, str]] = field(default_factory=list)
    """(character start, text) of each gold answer. Training uses the first; evaluation scores against all (SQuAD's
    dev set has several per question)."""


@dataclass(frozen=True)
class LabelMap:
    """Label names <-> ids, in a stable order; what HF stores as ``id2label``/``label2id``."""

    names: tuple[str, ...]
    """Label names in id order: numeric names numerically, then the rest alphabetically (tags: "O" first)."""

    @classmethod
    def build(cls, labels: Iterable[Any], outside_first: bool = False) -> LabelMap:
        names = sorted({label_name(v) for v in labels}, key=_label_sort_key)
        if outside_first and "O" in names:
            names.remove("O")
            names.insert(0, "O")
        if not names:
            raise ValueError("no labels found in the training data")
        return cls(tuple(names))

    @classmethod
    def from_id2label(cls, id2label: dict) -> LabelMap:
        return cls(tuple(str(id2label[k]) for k in sorted(id2label, key=int)))

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.names))

    @property
    def label2id(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    def __len__(self) -> int:
        return len(self.names)

    def check(self, labels: Iterable[Any], source: str, train_source: str) -> None:
        """Fail, naming the labels, when ``labels`` holds one training never saw (the head has no output for it)."""
        known = set(self.names)
        unseen = Counter(label_name(v) for v in labels if label_name(v) not in known)
        if unseen:
            shown = ", ".join(f"{k!r} ({n}x)" for k, n in unseen.most_common(10))
            raise ValueError(
                f"label(s) {shown} in {source} never occur in the training data {train_source}, so the model has no "
                f"output for them; known labels: {list(self.names)[:50]}. Fix the labels or train on data that has "
                "them."
            )

    def encode(self, labels: Sequence[Any]) -> list[int]:
        ids = self.label2id
        return [ids[label_name(v)] for v in labels]

    def encode_known(self, labels: Sequence[Any]) -> list[int | None]:
        """As `encode`, with None for a label training never saw (an evaluation's tag, scored as an error)."""
        ids = self.label2id
        return [ids.get(label_name(v)) for v in labels]

    def unseen(self, labels: Iterable[Any]) -> Counter:
        """How often each label training never saw occurs in ``labels``."""
        known = set(self.names)
        return Counter(label_name(v) for v in labels if label_name(v) not in known)


def label_name(value: Any) -> str:
    """Labels are compared by name, so 1 (JSON) and "1" (CSV) are the same class; 1.0 reads as 1."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _label_sort_key(name: str) -> tuple:
    try:
        return (0, float(name), name)
    except ValueError:
        return (1, 0.0, name)


def _require(records: list[dict], columns: Sequence[str], source: str) -> None:
    if not records:
        raise ValueError(f"{source} has no records")
    for i, rec in enumerate(records):
        missing = [c for c in columns if c not in rec]
        if missing:
            where = "" if i == 0 else f" (row {i})"
            raise ValueError(
                f"column {missing[0]!r} is missing in {source}{where}; columns present: {sorted(rec)}. "
                f"Name the right column with the matching --*-column flag."
            )
        null = [c for c in columns if rec[c] is None]
        if null:  # the column is there, its value is not: a data problem, not a wrong flag
            rows = sum(1 for r in records if r.get(null[0], "") is None)
            raise ValueError(
                f"column {null[0]!r} is null in {rows:,} of the {len(records):,} rows of {source} (the first: row {i}):"
                " remove those rows or fill them in"
            )


def sequence_examples(records: list[dict], task: str, columns: TaskColumns, source: str) -> list[SequenceExample]:
    text_col, pair_col = columns.texts_for(task)
    needed = [text_col] + ([pair_col] if pair_col else []) + [columns.label_column]
    _require(records, needed, source)
    out = []
    for i, rec in enumerate(records):
        label = rec[columns.label_column]
        if task == "regression":
            try:
                label = float(label)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{source} row {i}: regression label {columns.label_column!r}={label!r} "
                                 "is not a number") from e
            if not math.isfinite(label):
                raise ValueError(f"{source} row {i}: regression label {label!r} is not finite")
        out.append(SequenceExample(str(rec[text_col]), str(rec[pair_col]) if pair_col else None, label))
    return out


def tagging_examples(records: list[dict], columns: TaskColumns, source: str) -> list[TaggingExample]:
    _require(records, [columns.tokens_column, columns.tags_column], source)
    out = []
    for i, rec in enumerate(records):
        tokens, tags = list(rec[columns.tokens_column]), list(rec[columns.tags_column])
        if len(tokens) != len(tags):
            raise ValueError(f"{source} row {i}: {len(tokens)} tokens but {len(tags)} tags; they must pair up")
        out.append(TaggingExample([str(t) for t in tokens], [str(t) for t in tags]))
    return out


def qa_examples(records: list[dict], columns: TaskColumns, source: str) -> list[QAExample]:
    """Flat records (context, question, answer_start, answer_text) or flattened SQuAD (with ``answers``)."""
    squad = "answers" in records[0] if records else False
    answer_cols = [] if squad else [columns.answer_start_column, columns.answer_text_column]
    _require(records, [columns.context_column, columns.question_column, *answer_cols], source)
    out = []
    for i, rec in enumerate(records):
        if squad:
            answers = [(int(a["answer_start"]), str(a["text"])) for a in rec["answers"]]
        else:
            answers = [(int(rec[columns.answer_start_column]), str(rec[columns.answer_text_column]))]
        out.append(QAExample(str(rec.get("id", i)), str(rec[columns.context_column]),
                             str(rec[columns.question_column]), answers))
    return out
