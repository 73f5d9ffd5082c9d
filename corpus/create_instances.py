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
  in a distributed build) instead of the whole in-memory corpus (``corpus/pairs.py``).
- Truncation coin flips, candidate shuffle and 80/10/10 draws are replaced by draws with the same law
  (``corpus/pairs.py``, ``corpus/masking.py``); whole-word groups never span the middle [SEP].
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from corpus.masking import MaskedBatch, VocabInfo, apply_masks, choose_positions, mask_sequences, num_to_predict
from corpus.pairs import BlockPairs, RandomDocPool, finish_pairs, pack_sentences, pair_words, pass_target, walk_chunks
from corpus.ragged import ragged_indices
from corpus.rng import DEFAULT_SEED, derive_seed, mix64, stream
from corpus.schema import SHARD_COLUMNS

__all__ = ["InstanceConfig", "RandomDocPool", "VocabInfo", "create_instances", "create_instances_batch",
           "create_instances_flat", "count_pairs", "COLUMNS"]

COLUMNS = SHARD_COLUMNS + ("key",)  # the shards' columns plus the hash key that orders rows in _work
# 13 tokens of text: about one short sentence per segment, the least that still makes a next-sentence pair.
MIN_SEQ_LENGTH = 16


@dataclass(frozen=True)
class InstanceConfig:
    """The reference's instance parameters (names and defaults of create_pretraining_data.py's flags)."""

    max_seq_length: int = 128
    """Tokens per instance, [CLS] and both [SEP] included; 128 is the reference's default (BERT pre-trains at 128,
    then 512). At most 65,535 because positions are stored as uint16."""
    max_predictions_per_seq: int = 20
    """Most masked positions per instance; 20 is the reference's default for 128 tokens (BERT uses 80 at 512)."""
    masked_lm_prob: float = 0.15
    """Share of an instance's tokens chosen for the MLM loss (Devlin et al. 2019: 15%), capped by
    ``max_predictions_per_seq``."""
    short_seq_prob: float = 0.1
    """Probability that a document pass draws a target length uniform in [2, max_seq_length - 3] instead of the
    full length; the reference's 10%, so the model also sees short sequences."""
    whole_word_mask: bool = False
    """Mask all WordPieces of a word together (the reference's ``--do_whole_word_mask``, off by default)."""
    seed: int = DEFAULT_SEED
    """Root of every random stream, hashed with the document id and pass (``corpus.rng``); the reference's 12345."""

    def __post_init__(self) -> None:
        if not MIN_SEQ_LENGTH <= self.max_seq_length <= 65535:
            raise ValueError(
                f"--max-seq-length {self.max_seq_length}: use {MIN_SEQ_LENGTH}..65535 (BERT uses 128, then 512). "
                f"[CLS] A [SEP] B [SEP] leaves max_seq_length - 3 tokens for two segments; below {MIN_SEQ_LENGTH} "
                "they are scraps of one sentence, not a pair. Positions are stored as uint16."
            )
        if self.max_predictions_per_seq < 1:
            raise ValueError(f"max_predictions_per_seq={self.max_predictions_per_seq}: use at least 1 "
                             "(20 at 128, 80 at 512)")
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
    ``(values, offsets)``, the others as numpy arrays (a_length int16, next_sentence_label int8, key uint64).

    Per document pass (its stream ``rng.stream(seed, doc_id, pass)``, drawn in this order): ``2 + 2 * sentences``
    uniforms for the chunk walk, one 64-bit seed for its pairs' counter-based streams, then per pair
    ``max_seq_length`` masking keys and ``max_predictions_per_seq`` masking draws. Everything else runs once for
    the whole block in numpy (``pairs.finish_pairs``, ``_assemble``, ``masking.choose_positions``).
    """
    passes = list(passes)
    dtype = np.dtype(np.uint16) if vocab.vocab_size <= 65536 else np.dtype(np.uint32)
    seq, prob, max_pred = cfg.max_seq_length, cfg.masked_lm_prob, cfg.max_predictions_per_seq
    max_num_tokens = seq - 3
    draw_range = 10 * vocab.vocab_size  # see masking.apply_masks
    walk: list[int] = []
    doc_tokens: list[np.ndarray] = []
    doc_offsets: list[np.ndarray] = []  # each document's sentence offsets, made block-wide
    counts: list[int] = []  # per pass: its pairs, then what they share
    sent_base: list[int] = []
    targets: list[int] = []
    own: list[int] = []
    pair_seeds: list[int] = []
    key_bases: list[int] = []
    pass_keys: list[tuple[str, int]] = []
    mask_keys: list[np.ndarray] = []
    mask_draws: list[np.ndarray] = []
    token_base = sentence_base = 0
    for doc_id, sentences in docs:
        tokens, sent_offsets = pack_sentences(sentences)  # once per document, shared by its passes
        if len(sent_offsets) == 1:
            continue
        offsets_list = sent_offsets.tolist()
        code = pool.code(doc_id)
        for pass_idx in passes:
            # One stream per (seed, document, pass), drawn in a fixed order: the output never depends on the block.
            gen = stream(cfg.seed, doc_id, pass_idx)
            u = gen.random(2 + 2 * len(offsets_list)).tolist()
            target = pass_target(u[0], u[1], max_num_tokens, cfg.short_seq_prob)
            n = walk_chunks(offsets_list, target, u, walk)
            pair_seeds.append(int(gen.bit_generator.random_raw()))
            if not cfg.whole_word_mask:
                mask_keys.append(gen.random((n, seq)))
                mask_draws.append(gen.integers(0, draw_range, (n, max_pred)))
            counts.append(n)
            sent_base.append(sentence_base)
            targets.append(target)
            own.append(code)
            key_bases.append(derive_seed(cfg.seed, doc_id, pass_idx, "key"))
            pass_keys.append((doc_id, pass_idx))
        doc_tokens.append(tokens)
        doc_offsets.append(sent_offsets + token_base)
        token_base += len(tokens)
        sentence_base += len(sent_offsets)
    if not counts:
        return None
    n_pass = np.asarray(counts, dtype=np.int64)
    records = np.asarray(walk, dtype=np.int64).reshape(-1, 4)
    base = np.repeat(np.asarray(sent_base, dtype=np.int64), n_pass)
    records[:, 0] += base
    records[:, 2] += base
    index = np.arange(len(records)) - np.repeat(np.cumsum(n_pass) - n_pass, n_pass)  # pair index in its pass
    # Pair k of a pass is seeded with word k of the SplitMix64 stream of the pass's seed.
    seeds = pair_words(np.repeat(np.asarray(pair_seeds, dtype=np.uint64), n_pass), index)
    pairs = finish_pairs(records, np.concatenate(doc_offsets), np.repeat(np.asarray(targets, np.int64), n_pass),
                         np.repeat(np.asarray(own, np.int64), n_pass), seeds, pool, max_num_tokens)
    flat, seq_len, a_len = _assemble(pairs, np.concatenate(doc_tokens), pool.tokens, vocab, dtype)
    offsets = _offsets(seq_len)
    if cfg.whole_word_mask:
        # Word groups depend on the tokens: each pass masks its own rows from a second stream of its own.
        parts, row = [], 0
        for (doc_id, pass_idx), n in zip(pass_keys, counts, strict=False):
            o = offsets[row : row + n + 1]
            parts.append(mask_sequences(flat[o[0] : o[-1]], o - o[0], a_len[row : row + n], vocab,
                                        stream(cfg.seed, doc_id, pass_idx, "wwm"), prob, max_pred, True))
            row += n
        masked = MaskedBatch(*(np.concatenate([getattr(m, f) for m in parts])
                               for f in ("input_ids", "positions", "labels", "counts")))
    else:
        rows, positions = choose_positions(np.concatenate(mask_keys), seq_len, a_len,
                                           num_to_predict(seq_len, prob, max_pred))
        n_chosen = np.bincount(rows, minlength=len(seq_len))
        rank = np.arange(len(rows)) - np.repeat(_offsets(n_chosen)[:-1], n_chosen)  # r-th chosen position of its row
        draws = np.concatenate(mask_draws)[rows, rank]
        out, labels = apply_masks(flat, offsets[rows] + positions, draws, vocab)
        masked = MaskedBatch(out, positions, labels, n_chosen)
    mask_offsets = _offsets(masked.counts)
    return {
        "input_ids": (masked.input_ids, offsets),
        "a_length": a_len.astype(np.int16),
        "masked_lm_positions": (masked.positions.astype(np.uint16), mask_offsets),
        "masked_lm_ids": (masked.labels.astype(dtype, copy=False), mask_offsets),
        "next_sentence_label": pairs.is_random.astype(np.int8),
        "key": _keys(key_bases, counts),
    }


def count_pairs(
    docs: Iterable[tuple[str, Sequence[np.ndarray]]],
    passes: Iterable[int],
    cfg: InstanceConfig,
) -> np.ndarray:
    """Rows ``create_instances_flat`` makes of each (document, pass), shape (documents, passes), without making
    them: only each pass's chunk walk (the first ``2 + 2 * sentences`` uniforms of its stream), no pairs, tokens or
    masks. What the build's plan needs to place every row before any shard makes it (``pipeline/instances.py``)."""
    passes = list(passes)
    max_num_tokens = cfg.max_seq_length - 3
    out: list[int] = []
    walk: list[int] = []
    for doc_id, sentences in docs:
        _, sent_offsets = pack_sentences(sentences)
        if len(sent_offsets) == 1:
            out.extend([0] * len(passes))
            continue
        offsets_list = sent_offsets.tolist()
        for pass_idx in passes:
            u = stream(cfg.seed, doc_id, pass_idx).random(2 + 2 * len(offsets_list)).tolist()
            walk.clear()
            out.append(walk_chunks(offsets_list, pass_target(u[0], u[1], max_num_tokens, cfg.short_seq_prob), u,
                                   walk))
    return np.asarray(out, dtype=np.int64).reshape(-1, len(passes))


def _assemble(pairs: BlockPairs, block: np.ndarray, pool_tokens: np.ndarray, vocab: VocabLike,
              dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[CLS] A [SEP] B [SEP]`` for every pair of a block at once: (flat ids, lengths, A lengths). A and an
    actual-next B are slices of ``block`` (the block's documents back to back), a random-next B of the pool's."""
    a0, a1, b0, b1, from_pool = pairs
    la, lb = a1 - a0, b1 - b0
    lengths = la + lb + 3
    ends = np.cumsum(lengths)
    starts = ends - lengths
    flat = np.empty(int(ends[-1]) if len(ends) else 0, dtype)
    flat[starts] = vocab.cls_id
    flat[starts + 1 + la] = vocab.sep_id
    flat[ends - 1] = vocab.sep_id
    flat[ragged_indices(starts + 1, la)] = block[ragged_indices(a0, la)]
    b_starts = starts + 2 + la
    own = ~from_pool
    flat[ragged_indices(b_starts[own], lb[own])] = block[ragged_indices(b0[own], lb[own])]
    flat[ragged_indices(b_starts[from_pool], lb[from_pool])] = pool_tokens[ragged_indices(b0[from_pool], lb[from_pool])]
    return flat, lengths, la


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
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=False)]
