"""BERT pre-training instances from one document pass: NSP pairs + MLM masks, faithful to the reference.

``create_instances(doc_id, sentences, pass_idx, cfg, pool, vocab)`` is the reference's
``create_instances_from_document`` (google-research/bert ``create_pretraining_data.py``) with its randomness
re-keyed for a distributed build. Every random decision of a document pass comes from one stream seeded by
blake2b over (cfg.seed, doc_id, pass_idx) (``rng.stream``), so the output never depends on worker count, block layout or
arrival order. Where the reference differs (see also ``docs/data.md``):

- One global RNG over the run -> one RNG per (seed, document id, pass); the reference's document shuffle and
  its final instance shuffle have no counterpart here: each instance carries a uint64 ``key`` =
  ``rng.instance_keys(seed, doc_id, pass, n)[index]`` for the downstream seeded shuffle/partition.
- Random-next documents come from a ``RandomDocPool`` (all documents in the plain loop; a seeded sample of the corpus
  in a distributed build) instead of the whole in-memory corpus (``pipeline/pairs.py``).
- Truncation coin flips, candidate shuffle and 80/10/10 draws are replaced by draws with the same law
  (``pipeline/pairs.py``, ``pipeline/masking.py``); whole-word groups never span the middle [SEP].
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pipeline.masking import MaskedBatch, VocabInfo, apply_masks, choose_positions, mask_sequences, num_to_predict
from pipeline.pairs import RandomDocPool, document_pairs, pack_sentences
from pipeline.ragged import ragged_indices
from pipeline.rng import UniformStream, derive_seed, mix64, stream

__all__ = ["InstanceConfig", "RandomDocPool", "VocabInfo", "create_instances", "create_instances_batch",
           "create_instances_flat", "COLUMNS"]

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
    sentences: Sequence[np.ndarray],
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
    Same result as ``create_instances_batch([(doc_id, sentences)], [pass_idx], ...)``, which is faster per instance.
    """
    return create_instances_batch([(doc_id, sentences)], [pass_idx], cfg, pool, vocab)


def create_instances_batch(
    docs: Iterable[tuple[str, Sequence[np.ndarray]]],
    passes: Iterable[int],
    cfg: InstanceConfig,
    pool: RandomDocPool,
    vocab: VocabLike,
) -> dict[str, list]:
    """``create_instances`` for every document and pass, rows ordered by document then pass, identical to calling
    it per (document, pass): each pass draws only from its own stream. Masking runs once over the whole batch, so
    numpy's per-call overhead is paid per batch instead of per document pass (most of the cost when documents are
    short). Memory: ~10 bytes x instances x max_seq_length for the batch; feed a block of documents at a time.
    """
    flat = create_instances_flat(docs, passes, cfg, pool, vocab)
    if flat is None:
        return {c: [] for c in COLUMNS}
    return {
        "input_ids": _split(*flat["input_ids"]),
        "a_length": flat["a_length"].tolist(),
        "masked_lm_positions": _split(*flat["masked_lm_positions"]),
        "masked_lm_ids": _split(*flat["masked_lm_ids"]),
        "next_sentence_label": flat["next_sentence_label"].tolist(),
        "key": flat["key"].tolist(),
    }


def create_instances_flat(
    docs: Iterable[tuple[str, Sequence[np.ndarray]]],
    passes: Iterable[int],
    cfg: InstanceConfig,
    pool: RandomDocPool,
    vocab: VocabLike,
) -> dict[str, Any] | None:
    """``create_instances_batch`` as columns ready for Arrow (None when there are no instances): list columns as
    ``(values, offsets)``, the others as numpy arrays (a_length int16, next_sentence_label int8, key uint64)."""
    passes = list(passes)
    dtype = np.dtype(np.uint16) if vocab.vocab_size <= 65536 else np.dtype(np.uint32)
    cls = np.array([vocab.cls_id], dtype=dtype)
    sep = np.array([vocab.sep_id], dtype=dtype)
    prob, max_pred = cfg.masked_lm_prob, cfg.max_predictions_per_seq
    draw_range = 10 * vocab.vocab_size  # see masking.apply_masks
    pool_tokens = pool.tokens
    pieces: list[np.ndarray] = []
    seq_len: list[int] = []
    a_len: list[int] = []
    nsp: list[int] = []
    key_bases: list[int] = []
    key_counts: list[int] = []
    mask_keys: list[np.ndarray] = []
    mask_draws: list[np.ndarray] = []
    wwm_parts: list[tuple[MaskedBatch, np.ndarray]] = []
    all_pairs: list[tuple] = []
    pass_bases: list[int] = []
    doc_tokens: list[np.ndarray] = []
    doc_base = 0
    for doc_id, sentences in docs:
        tokens, sent_offsets = pack_sentences(sentences)  # once per document, shared by its passes
        if len(sent_offsets) == 1:
            continue
        offsets_list = sent_offsets.tolist()
        if not cfg.whole_word_mask:
            doc_tokens.append(tokens)
        for pass_idx in passes:
            # One stream per (seed, document, pass): pairs draw from it first, then masking, always in this order.
            gen = stream(cfg.seed, doc_id, pass_idx)
            pairs = document_pairs(doc_id, offsets_list, UniformStream(gen), pool, cfg.max_seq_length, cfg.short_seq_prob)
            key_bases.append(derive_seed(cfg.seed, doc_id, pass_idx, "key"))
            key_counts.append(len(pairs))
            if not cfg.whole_word_mask:
                # The sequences are assembled later for the whole batch, from these bounds (numpy, no loop).
                all_pairs += pairs
                pass_bases.append(doc_base)
                total = sum(a1 - a0 + b1 - b0 for a0, a1, _, b0, b1, _ in pairs) + 3 * len(pairs)
                # A block of max_predictions_per_seq draws per sequence (a few spare): the batch can then pick each
                # position's draw by (sequence, rank) without knowing the counts yet.
                mask_keys.append(gen.random(total))
                mask_draws.append(gen.integers(0, draw_range, len(pairs) * max_pred))
            else:
                # Word groups depend on the tokens: mask this document pass on its own (not the default path).
                first_piece = len(pieces)
                for a0, a1, from_pool, b0, b1, is_random_next in pairs:
                    pieces += (cls, tokens[a0:a1], sep, (pool_tokens if from_pool else tokens)[b0:b1], sep)
                    a_len.append(a1 - a0)
                    seq_len.append(a1 - a0 + b1 - b0 + 3)
                    nsp.append(1 if is_random_next else 0)
                flat = np.concatenate(pieces[first_piece:]).astype(dtype, copy=False)
                offsets = _offsets(seq_len[len(seq_len) - len(pairs) :])
                group_a = np.asarray(a_len[len(a_len) - len(pairs) :], dtype=np.int64)
                wwm_parts.append((mask_sequences(flat, offsets, group_a, vocab, gen, prob, max_pred, True), offsets))
        doc_base += len(tokens)
    if not seq_len and not all_pairs:
        return None
    if not cfg.whole_word_mask:
        flat, seq_len, a_len, nsp = _assemble(all_pairs, np.repeat(pass_bases, key_counts), doc_tokens, pool_tokens,
                                              vocab, dtype)
    offsets = _offsets(seq_len)
    if cfg.whole_word_mask:
        masked = MaskedBatch(
            input_ids=np.concatenate([m.input_ids for m, _ in wwm_parts]),
            positions=np.concatenate([m.positions for m, _ in wwm_parts]),
            labels=np.concatenate([m.labels for m, _ in wwm_parts]),
            counts=np.concatenate([m.counts for m, _ in wwm_parts]),
        )
    else:
        lengths = np.asarray(seq_len, dtype=np.int64)
        a_arr = np.asarray(a_len, dtype=np.int64)
        rows, positions = choose_positions(
            np.concatenate(mask_keys), offsets, a_arr, num_to_predict(lengths, prob, max_pred)
        )
        counts = np.bincount(rows, minlength=len(seq_len))
        rank = np.arange(len(rows)) - np.repeat(_offsets(counts)[:-1], counts)  # r-th chosen position of its row
        draws = np.concatenate(mask_draws)[rows * max_pred + rank]
        out, labels = apply_masks(flat, offsets[rows] + positions, draws, vocab)
        masked = MaskedBatch(out, positions, labels, counts)
    mask_offsets = _offsets(masked.counts)
    return {
        "input_ids": (masked.input_ids, offsets),
        "a_length": np.asarray(a_len, dtype=np.int16),
        "masked_lm_positions": (masked.positions.astype(np.uint16), mask_offsets),
        "masked_lm_ids": (masked.labels.astype(dtype, copy=False), mask_offsets),
        "next_sentence_label": np.asarray(nsp, dtype=np.int8),
        "key": _keys(key_bases, key_counts),
    }


def _assemble(pairs: list[tuple], bases: np.ndarray, doc_tokens: list[np.ndarray], pool_tokens: np.ndarray,
              vocab: VocabLike, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``[CLS] A [SEP] B [SEP]`` for every pair of a batch at once: (flat ids, lengths, A lengths, random-next).

    ``pairs`` are ``document_pairs`` tuples (bounds into their document's tokens, or into the pool's for a random
    B); ``bases[i]`` is where pair i's document starts in ``concatenate(doc_tokens)``."""
    p = np.asarray(pairs, dtype=np.int64).reshape(-1, 6)
    a0, a1, from_pool, b0, b1, random_next = p.T
    la, lb = a1 - a0, b1 - b0
    lengths = la + lb + 3
    ends = np.cumsum(lengths)
    starts = ends - lengths
    block = np.concatenate(doc_tokens) if doc_tokens else np.zeros(0, dtype)
    flat = np.empty(int(ends[-1]) if len(ends) else 0, dtype)
    flat[starts] = vocab.cls_id
    flat[starts + 1 + la] = vocab.sep_id
    flat[ends - 1] = vocab.sep_id
    flat[ragged_indices(starts + 1, la)] = block[ragged_indices(bases + a0, la)]
    b_starts = starts + 2 + la
    own = from_pool == 0
    flat[ragged_indices(b_starts[own], lb[own])] = block[ragged_indices(bases[own] + b0[own], lb[own])]
    flat[ragged_indices(b_starts[~own], lb[~own])] = pool_tokens[ragged_indices(b0[~own], lb[~own])]
    return flat, lengths, la, random_next


def _keys(bases: list[int], counts: list[int]) -> np.ndarray:
    """``instance_keys`` for every document pass of the batch in one vectorised call."""
    n = np.asarray(counts, dtype=np.int64)
    starts = np.repeat(np.cumsum(n) - n, n)
    index = (np.arange(int(n.sum())) - starts).astype(np.uint64)
    with np.errstate(over="ignore"):
        return mix64(np.repeat(np.asarray(bases, dtype=np.uint64), n) + index)


def _offsets(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _split(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    # Plain slicing: np.split costs ~5 µs per piece in Python-level overhead.
    bounds = offsets.tolist()
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
