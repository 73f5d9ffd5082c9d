"""One batch of dataset rows as the model takes it: padded to a fixed width, masked-LM slots padded, and optionally
re-masked.

`collate` pads a batch to the smallest of a fixed set of widths (`length_buckets`, e.g. multiples of
max_seq_length / 4) that holds its longest row, and its masked-LM slots to `max_predictions` (label -100 in
padding): a compiled model then sees one shape per width, never a new one. Without buckets it pads to the longest
row rounded up to a multiple of 8 (evaluation tools, tests).

Dynamic re-masking (`Remasker`) restores the original ids and redraws the MLM positions with the rule the builder
used (15% of non-special positions, at most `max_predictions`, 80% [MASK] / 10% random / 10% kept). Its random
numbers are keyed by example: each token's draws are a hash of (seed, the row's example id, the epoch it is read
in, its position, which draw), a counter-based generator computed for all tokens at once. A row's mask is then the
same whichever batch, rank or world size reads it, and new in each epoch. It masks single word pieces (the builder
may have used whole-word masking; the statistics per position are the same).

Outputs are numpy arrays; the training loop wraps them with `torch.from_numpy`.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from bert_core.losses import IGNORE_INDEX  # the label of padded MLM slots
from corpus.rng import derive_seed, mix64
from pretraining.rows import Rows


def keyed_uniforms(row_keys: np.ndarray, row_of: np.ndarray, column: np.ndarray, draw: int) -> np.ndarray:
    """One uniform [0, 1) per token: a hash of its row's key, its column and the draw number."""
    with np.errstate(over="ignore"):  # wrapping uint64 arithmetic is the hash's
        counter = row_keys[row_of] + column.astype(np.uint64) * np.uint64(4) + np.uint64(draw)
        return (mix64(mix64(counter)) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def example_keys(rows: Rows, seed: int) -> np.ndarray:
    """Each row's key for its random draws: (seed, example id, epoch)."""
    if rows.example is None or rows.epoch is None:
        raise ValueError("dynamic masking needs the rows' example ids and epochs (rows of the training stream)")
    base = np.uint64(derive_seed("remask", seed))
    with np.errstate(over="ignore"):
        return mix64(mix64(rows.example.astype(np.uint64) ^ base) + rows.epoch.astype(np.uint64))


def mask_counts(lengths: np.ndarray, masked_lm_prob: float, max_predictions: int) -> np.ndarray:
    """Masked positions per row of `lengths` tokens under the builder's token rule (`corpus.masking`, not whole-word)
    and `Remasker`'s: round(15% of the row) half to even, at least 1, at most `max_predictions` and the row's
    candidates (all but [CLS] and both [SEP])."""
    lengths = np.asarray(lengths, dtype=np.int64)
    # The reference rounds len(tokens) * prob with Python 3 rounding (half to even), as np.round does.
    k = np.minimum(max_predictions, np.maximum(1, np.round(lengths * masked_lm_prob))).astype(np.int64)
    return np.minimum(k, np.maximum(lengths - 3, 0))  # a row never has more picks than candidates


def padded_width(longest: int, pad_multiple: int = 8, length_buckets: Sequence[int] | None = None) -> int:
    """The smallest bucket width >= `longest` (with buckets), else `longest` rounded up to `pad_multiple`."""
    if length_buckets:
        i = int(np.searchsorted(np.asarray(length_buckets), longest))
        if i == len(length_buckets):
            raise ValueError(f"a row of {longest} tokens is longer than the largest length bucket "
                             f"{length_buckets[-1]}; add a bucket of at least the dataset's max_seq_length")
        return int(length_buckets[i])
    return int(-(-longest // pad_multiple) * pad_multiple)


def collate(rows: Rows, max_predictions: int | None = None, pad_id: int = 0, pad_multiple: int = 8,
            length_buckets: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """Pad a batch to the smallest of `length_buckets` that fits its longest row (without buckets: the longest
    row rounded up to `pad_multiple`); MLM slots padded to `max_predictions`.

    Returns int64 arrays: input_ids, attention_mask, token_type_ids (B, T); masked_lm_positions and
    masked_lm_labels (B, P) with padded slots at position 0 and label -100; next_sentence_label (B,).
    """
    n, lengths = len(rows), rows.lengths
    if n == 0:
        raise ValueError("cannot collate an empty batch")
    width = padded_width(int(lengths.max()), pad_multiple, length_buckets)
    cols = np.arange(width)
    attention_mask = cols[None, :] < lengths[:, None]
    input_ids = np.full((n, width), pad_id, dtype=np.int64)
    input_ids[attention_mask] = rows.ids  # boolean indexing walks row-major, the order of the flat values
    # Segment A is [CLS] A [SEP]: a_length + 2 positions; everything after (B [SEP]) is segment 1.
    token_type_ids = ((cols[None, :] >= rows.a_length[:, None] + 2) & attention_mask).astype(np.int64)

    n_pred = np.diff(rows.pos_off)
    width_p = int(n_pred.max()) if max_predictions is None else max_predictions
    if n_pred.max() > width_p:
        raise ValueError(f"a row has {int(n_pred.max())} masked positions, more than max_predictions={width_p}")
    slot = np.arange(width_p)[None, :] < n_pred[:, None]
    positions = np.zeros((n, width_p), dtype=np.int64)
    labels = np.full((n, width_p), IGNORE_INDEX, dtype=np.int64)
    positions[slot] = rows.pos
    labels[slot] = rows.lab
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask.astype(np.int64),
        "token_type_ids": token_type_ids,
        "masked_lm_positions": positions,
        "masked_lm_labels": labels,
        "next_sentence_label": rows.nsp.astype(np.int64),
    }


@dataclass(frozen=True)
class Remasker:
    """Dynamic masking: restore the original ids, then redraw MLM positions with the builder's rule."""

    vocab_size: int
    """Random replacements (10% of the picks) are drawn uniformly from ids [0, vocab_size)."""
    mask_id: int
    """The [MASK] token's id, written at 80% of the picks."""
    max_predictions: int
    """At most this many picks per row: the dataset's max_predictions, the masked-LM slots `collate` pads to."""
    masked_lm_prob: float = 0.15
    """The share of a row's tokens picked (rounded half to even as the reference does, at least 1): the BERT
    paper's 15%."""

    def __post_init__(self) -> None:
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if not 0 <= self.mask_id < self.vocab_size:
            raise ValueError(f"mask_id {self.mask_id} is outside the vocabulary (size {self.vocab_size})")

    def counts(self, lengths: np.ndarray) -> np.ndarray:
        """Masked positions per row of `lengths` tokens: what `__call__` draws, known before reading the rows."""
        return mask_counts(lengths, self.masked_lm_prob, self.max_predictions)

    def __call__(self, rows: Rows, seed: int) -> Rows:
        n, lengths = len(rows), rows.lengths
        original = rows.ids.copy()
        original[np.repeat(rows.ids_off[:-1], np.diff(rows.pos_off)) + rows.pos] = rows.lab
        row_of = np.repeat(np.arange(n), lengths)
        col = np.arange(len(original)) - rows.ids_off[:-1][row_of]
        keys = example_keys(rows, seed)
        # Candidates: every position but [CLS] (0), the [SEP] after A (a_length + 1) and the final [SEP].
        special = (col == 0) | (col == rows.a_length[row_of] + 1) | (col == lengths[row_of] - 1)
        k = self.counts(lengths)
        pick = keyed_uniforms(keys, row_of, col, 0)
        pick[special] = 2.0  # never chosen while a real candidate is left
        order = np.lexsort((pick, row_of))  # grouped by row, random order inside each row
        rank_in_row = np.arange(len(order)) - rows.ids_off[:-1][row_of[order]]
        chosen = np.sort(order[(rank_in_row < k[row_of[order]]) & ~special[order]])
        u = keyed_uniforms(keys, row_of[chosen], col[chosen], 1)
        ids = original.copy()
        ids[chosen[u < 0.8]] = self.mask_id
        rand = chosen[u >= 0.9]
        token = keyed_uniforms(keys, row_of[rand], col[rand], 2)
        ids[rand] = np.minimum((token * self.vocab_size).astype(np.int64), self.vocab_size - 1)
        pos_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(row_of[chosen], minlength=n), out=pos_off[1:])
        return Rows(ids, rows.ids_off, rows.a_length, col[chosen], pos_off, original[chosen], rows.nsp, rows.example,
                    rows.epoch)


def finite_batches(rows: Rows, batch_size: int, rank: int = 0, world_size: int = 1, max_rows: int | None = None,
                   max_predictions: int | None = None, pad_id: int = 0,
                   length_buckets: Sequence[int] | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Evaluation: this rank's contiguous share of (the first `max_rows` of) `rows`, once, last batch partial.

    Ranks may get different batch counts here, so callers must not run collectives per batch (sum, then reduce).
    """
    total = len(rows) if max_rows is None else min(max_rows, len(rows))
    lo, hi = rank * total // world_size, (rank + 1) * total // world_size
    for i in range(lo, hi, batch_size):
        yield collate(rows.slice(i, min(i + batch_size, hi)), max_predictions, pad_id, length_buckets=length_buckets)
