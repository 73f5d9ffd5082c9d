"""BERT pre-training instances from one document pass: NSP pairs + MLM masks, faithful to the reference.

``create_instances(doc_id, sentences, pass_idx, cfg, pool, vocab)`` is the reference's
``create_instances_from_document`` (google-research/bert ``create_pretraining_data.py``) with its randomness
re-keyed for a distributed build. Every random decision of a document pass comes from streams seeded by
``derive_seed(cfg.seed, doc_id, pass_idx, purpose)``, so the output never depends on worker count, block layout or
arrival order. Where the reference differs (see also ``docs/data.md``):

- One global RNG over the run -> one RNG per (seed, document id, pass); the reference's document shuffle and
  its final instance shuffle have no counterpart here: each instance carries ``key`` =
  ``derive_seed(seed, doc_id, pass, index)`` (uint64) for the downstream seeded shuffle/partition.
- Random-next documents come from a ``RandomDocPool`` (all documents in the plain loop; a seeded sample of the corpus
  in a distributed build) instead of the whole in-memory corpus (``pipeline/pairs.py``).
- Truncation coin flips, candidate shuffle and 80/10/10 draws are replaced by draws with the same law
  (``pipeline/pairs.py``, ``pipeline/masking.py``); whole-word groups never span the middle [SEP].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipeline.masking import VocabInfo, mask_sequences
from pipeline.pairs import RandomDocPool, document_pairs, pack_sentences
from pipeline.rng import UniformStream, derive_seeds, stream

__all__ = ["InstanceConfig", "RandomDocPool", "VocabInfo", "create_instances", "COLUMNS"]

COLUMNS = ("input_ids", "a_length", "masked_lm_positions", "masked_lm_ids", "next_sentence_label", "key")


@dataclass(frozen=True)
class InstanceConfig:
    """The reference's instance parameters (names and defaults of create_pretraining_data.py's flags)."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    whole_word_mask: bool = False
    seed: int = 12345

    def __post_init__(self) -> None:
        if not 5 <= self.max_seq_length <= 65535:
            raise ValueError(
                f"max_seq_length={self.max_seq_length}: use 5..65535 ([CLS] A [SEP] B [SEP] needs at least 5 "
                "tokens; positions are stored as uint16)"
            )
        if self.max_predictions_per_seq < 1:
            raise ValueError(f"max_predictions_per_seq={self.max_predictions_per_seq}: use at least 1 (20 at 128, 80 at 512)")
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise ValueError(f"masked_lm_prob={self.masked_lm_prob}: use a probability in (0, 1], e.g. 0.15")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob={self.short_seq_prob}: use a probability in [0, 1], e.g. 0.1")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed={self.seed!r}: use an integer")


class VocabLike(Protocol):
    vocab_size: int
    cls_id: int
    sep_id: int
    mask_id: int
    is_continuation: np.ndarray


def create_instances(
    doc_id: str,
    sentences: list[np.ndarray],
    pass_idx: int,
    cfg: InstanceConfig,
    pool: RandomDocPool,
    vocab: VocabLike,
) -> dict[str, list]:
    """Instances of one document in pass ``pass_idx``, as columns (one list entry per instance).

    ``input_ids``: masked ``[CLS] A [SEP] B [SEP]`` (uint16 for vocabularies up to 65,536 ids, else uint32);
    ``a_length``: tokens in A; ``masked_lm_positions`` (uint16, sorted) and ``masked_lm_ids`` (original ids);
    ``next_sentence_label``: 1 = B is a random next; ``key``: a uint64 for the downstream shuffle.
    Sentences with no tokens are dropped and an empty document gives no instances, as in the reference.
    """
    tokens, sent_offsets = pack_sentences(sentences)
    if len(sent_offsets) == 1:
        return {c: [] for c in COLUMNS}
    # One stream per (seed, document, pass): pairs draw from it first, then masking, always in the same order.
    gen = stream(cfg.seed, doc_id, pass_idx)
    pairs = document_pairs(doc_id, sent_offsets.tolist(), UniformStream(gen), pool, cfg.max_seq_length, cfg.short_seq_prob)
    n = len(pairs)
    dtype = np.dtype(np.uint16) if vocab.vocab_size <= 65536 else np.dtype(np.uint32)
    cls = np.array([vocab.cls_id], dtype=dtype)
    sep = cls.copy()
    sep[0] = vocab.sep_id

    # Lay every sequence of the pass back to back so that masking is a handful of numpy calls per document pass.
    pieces: list[np.ndarray] = []
    a_len = np.empty(n, dtype=np.int64)
    b_len = np.empty(n, dtype=np.int64)
    pool_tokens = pool.tokens
    for i, p in enumerate(pairs):
        b_src = pool_tokens if p.b_from_pool else tokens
        pieces += (cls, tokens[p.a0 : p.a1], sep, b_src[p.b0 : p.b1], sep)
        a_len[i] = p.a1 - p.a0
        b_len[i] = p.b1 - p.b0
    flat = np.concatenate(pieces).astype(dtype, copy=False)
    seq_len = a_len + b_len + 3
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(seq_len, out=offsets[1:])
    masked = mask_sequences(
        flat,
        offsets,
        a_len,
        vocab,
        gen,
        cfg.masked_lm_prob,
        cfg.max_predictions_per_seq,
        cfg.whole_word_mask,
    )
    mask_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(masked.counts, out=mask_offsets[1:])
    return {
        "input_ids": _split(masked.input_ids, offsets),
        "a_length": a_len.tolist(),
        "masked_lm_positions": _split(masked.positions.astype(np.uint16), mask_offsets),
        "masked_lm_ids": _split(masked.labels.astype(dtype, copy=False), mask_offsets),
        "next_sentence_label": [int(p.is_random_next) for p in pairs],
        # == derive_seed(cfg.seed, doc_id, pass_idx, i), hashing the common prefix once.
        "key": derive_seeds((cfg.seed, doc_id, pass_idx), range(n)),
    }


def _split(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    # Plain slicing: np.split costs ~5 µs per piece in Python-level overhead.
    bounds = offsets.tolist()
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
