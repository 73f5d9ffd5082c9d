"""Examples -> model inputs with the model's own WordPiece vocabulary, and batches padded only as far as needed.

Sequences are ``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` (segment 0 up to the first [SEP], 1 after), truncated
like the reference's ``_truncate_seq_pair`` (trim the longer side from the end). Tagging labels only the first
word piece of each word, -100 elsewhere (ignored by the loss), as the paper does for CoNLL NER; words past the
length limit get no prediction and are scored as "O". The tokenizer is the project's reference-faithful one
(``corpus.tokenize.build_tokenizer``) built from the model directory's ``vocab.txt``.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from bert_core.losses import IGNORE_INDEX  # the label the loss skips (not the first piece of a word)
from corpus.tokenize import build_tokenizer, read_vocab
from finetuning.examples import LabelMap, SequenceExample, TaggingExample
from storage.untrusted import read_local_bounded

log = logging.getLogger(__name__)

MAX_TOKENIZER_CONFIG_BYTES = 1 << 20  # a tokenizer_config.json is ~1 KB; a model folder may be anyone's


class TaskTokenizer:
    """WordPiece for fine-tuning: text -> ids (+ char offsets), words -> pieces, and the special ids."""

    def __init__(self, vocab_file: str | Path, do_lower_case: bool = True):
        self.vocab_file = str(vocab_file)
        self.do_lower_case = do_lower_case
        tokens = read_vocab(vocab_file)
        self.tok: Tokenizer = build_tokenizer(tokens, do_lower_case)
        ids = {t: i for i, t in enumerate(tokens)}
        missing = [t for t in ("[CLS]", "[SEP]", "[PAD]") if t not in ids]
        if missing:
            raise ValueError(f"{vocab_file} lacks the special token(s) {missing}; it is not a BERT vocabulary")
        self.cls_id, self.sep_id, self.pad_id = ids["[CLS]"], ids["[SEP]"], ids["[PAD]"]
        self.vocab_size = len(tokens)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> TaskTokenizer:
        """``vocab.txt`` of a model directory; casing from ``tokenizer_config.json`` (uncased when absent,
        like bert-base-uncased and our own exports)."""
        model_dir = Path(model_dir)
        vocab = model_dir / "vocab.txt"
        if not vocab.is_file():
            raise ValueError(f"{model_dir} has no vocab.txt; fine-tuning needs the model's WordPiece vocabulary")
        do_lower_case = True
        cfg = model_dir / "tokenizer_config.json"
        if cfg.is_file():
            settings = json.loads(read_local_bounded(cfg, MAX_TOKENIZER_CONFIG_BYTES, "tokenizer config"))
            do_lower_case = bool(settings.get("do_lower_case", True)) if isinstance(settings, dict) else True
        return cls(vocab, do_lower_case)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch_fast(texts, add_special_tokens=False)]


def truncate_pair(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    """The reference's ``_truncate_seq_pair``: drop from the end of the longer side until they fit."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_tokens:
        (a if len(a) > len(b) else b).pop()
    return a, b


def pack(cls_id: int, sep_id: int, a: list[int], b: list[int] | None) -> tuple[list[int], list[int]]:
    ids = [cls_id, *a, sep_id]
    types = [0] * len(ids)
    if b is not None:
        ids += [*b, sep_id]
        types += [1] * (len(b) + 1)
    return ids, types


@dataclass
class Features:
    """Row-aligned model inputs: ragged ``input_ids``/``token_type_ids`` and per-row (or per-token) labels."""

    input_ids: list[np.ndarray]
    """Per row, its word-piece ids with [CLS] and [SEP], unpadded (int32): a row is padded only in its batch."""
    token_type_ids: list[np.ndarray]
    """Per row, each position's segment (int8): 0 up to the first [SEP], 1 after it."""
    labels: list[np.ndarray] | np.ndarray | None = None
    """Sequence tasks: a class id (int64) or a float32 target per row. Tagging: per row, the tag id at each word's
    first piece and -100 (skipped by the loss) elsewhere. None for QA."""
    start_positions: np.ndarray | None = None
    """QA: per window, the sequence position of the answer's first word piece; 0 ([CLS]) when the answer is not in
    the window, as in the reference, and in every evaluation window."""
    end_positions: np.ndarray | None = None
    """QA: per window, the sequence position of the answer's last word piece; 0 ([CLS]) as for `start_positions`."""

    def __len__(self) -> int:
        return len(self.input_ids)


def sequence_features(examples: list[SequenceExample], tokenizer: TaskTokenizer, max_seq_length: int,
                      label_map: LabelMap | None) -> Features:
    """Single or pair sequences; ``label_map`` None means regression (float labels)."""
    a_ids = tokenizer.encode([e.text for e in examples])
    pair = examples and examples[0].text_pair is not None
    b_ids = tokenizer.encode([e.text_pair or "" for e in examples]) if pair else [None] * len(examples)
    input_ids, types = [], []
    for a, b in zip(a_ids, b_ids, strict=False):
        if b is None:
            a = a[: max_seq_length - 2]
        else:
            a, b = truncate_pair(a, b, max_seq_length - 3)
        ids, tt = pack(tokenizer.cls_id, tokenizer.sep_id, a, b)
        input_ids.append(np.asarray(ids, dtype=np.int32))
        types.append(np.asarray(tt, dtype=np.int8))
    if label_map is None:
        labels = np.asarray([float(e.label) for e in examples], dtype=np.float32)
    else:
        labels = np.asarray(label_map.encode([e.label for e in examples]), dtype=np.int64)
    return Features(input_ids, types, labels)


def tagging_features(examples: list[TaggingExample], tokenizer: TaskTokenizer, max_seq_length: int,
                     label_map: LabelMap) -> tuple[Features, list[np.ndarray]]:
    """Token tagging features and, per row, the word index of each labelled position (to map predictions back)."""
    input_ids, types, labels, word_positions = [], [], [], []
    truncated = 0
    for ex in examples:
        enc = tokenizer.tok.encode(ex.tokens, is_pretokenized=True, add_special_tokens=False)
        ids = enc.ids[: max_seq_length - 2]
        word_ids = enc.word_ids[: max_seq_length - 2]
        tag_ids = label_map.encode_known(ex.tags)  # None: a tag training never saw (not in the loss; the word
        row_labels = [IGNORE_INDEX]                #   keeps 'O' as its prediction and its gold tag: an error)
        words = []
        prev = None
        for w in word_ids:
            if w is not None and w != prev and tag_ids[w] is not None:
                row_labels.append(tag_ids[w])
                words.append(w)
            else:
                row_labels.append(IGNORE_INDEX)
            prev = w
        row_labels.append(IGNORE_INDEX)
        truncated += len(enc.ids) > len(ids)
        full, tt = pack(tokenizer.cls_id, tokenizer.sep_id, ids, None)
        input_ids.append(np.asarray(full, dtype=np.int32))
        types.append(np.asarray(tt, dtype=np.int8))
        labels.append(np.asarray(row_labels, dtype=np.int64))
        word_positions.append(np.asarray(words, dtype=np.int64))
    if truncated:
        log.warning("%d of %d sentences were longer than max_seq_length=%d word pieces; their last words are "
                    "predicted as 'O'", truncated, len(examples), max_seq_length)
    return Features(input_ids, types, labels), word_positions


def words_to_tags(pred_ids: np.ndarray, labels: np.ndarray, words: np.ndarray, n_words: int,
                  label_map: LabelMap) -> list[str]:
    """Per-word tags from per-position predictions: the first word piece speaks for the word."""
    tags = ["O"] * n_words
    first_piece = np.flatnonzero(labels != IGNORE_INDEX)
    for pos, w in zip(first_piece, words, strict=False):
        tags[int(w)] = label_map.names[int(pred_ids[pos])]
    return tags


def collate_features(features: Features, indices: np.ndarray | list[int], pad_id: int,
                     multiple_of: int = 8) -> dict[str, np.ndarray]:
    """A batch padded to its own longest row, rounded up to ``multiple_of`` (tensor-core friendly, few shapes)."""
    rows = [features.input_ids[i] for i in indices]
    width = max(len(r) for r in rows)
    width = -(-width // multiple_of) * multiple_of
    n = len(rows)
    input_ids = np.full((n, width), pad_id, dtype=np.int64)
    token_type_ids = np.zeros((n, width), dtype=np.int64)
    attention_mask = np.zeros((n, width), dtype=np.int64)
    for j, i in enumerate(indices):
        L = len(features.input_ids[i])
        input_ids[j, :L] = features.input_ids[i]
        token_type_ids[j, :L] = features.token_type_ids[i]
        attention_mask[j, :L] = 1
    batch = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
    if features.labels is not None:
        if isinstance(features.labels, np.ndarray):
            batch["labels"] = features.labels[np.asarray(indices)]
        else:
            lab = np.full((n, width), IGNORE_INDEX, dtype=np.int64)
            for j, i in enumerate(indices):
                lab[j, : len(features.labels[i])] = features.labels[i]
            batch["labels"] = lab
    if features.start_positions is not None:
        batch["start_positions"] = features.start_positions[np.asarray(indices)]
        batch["end_positions"] = features.end_positions[np.asarray(indices)]
    return batch
