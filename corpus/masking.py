"""Masked-LM selection (reference step 7), vectorised over many sequences at once (a document pass or a batch).

Reference law, per sequence: candidates are all positions except [CLS]/[SEP] (with whole-word masking a word and its
``##`` pieces form one candidate); shuffle them; ``num_to_predict = min(max_predictions_per_seq,
max(1, round(len(tokens) * masked_lm_prob)))`` with ``len(tokens)`` counting the 3 specials and Python 3 rounding
(half to even; ``np.rint`` rounds the same float the same way); take candidates in shuffled order, skipping a
whole-word group that would overshoot, until the count is reached; each chosen position independently becomes
[MASK] (80%), stays (10%) or becomes a uniformly random vocabulary id (10%); positions sorted.

How we differ, with the same distribution:
- "shuffle, take the first k" is done as "draw a uniform key per candidate, take the k smallest keys per sequence"
  (one row-wise sort of a padded key matrix for all sequences). Both give every k-subset the same probability.
- 80/10/10 and the random id come from one integer draw per position (``draw % 10``: 0-7 mask, 8 keep, 9 random;
  ``draw // 10``: the random id) instead of the reference's two or three draws: same probabilities, independent
  per position and of each other.
- Whole-word groups never span the [SEP] between A and B. The reference appends a ``##`` piece at the start of B
  (possible after front truncation) to A's last word, since it only skips the [SEP]; we start a new group there.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

_SPECIAL_SORT_KEY = 2.0  # keys of non-candidates sort after every candidate key in [0, 1)


@dataclass(frozen=True, eq=False)
class VocabInfo:
    """What the instance builder needs to know about a vocabulary (cheap to build and to pickle)."""

    vocab_size: int
    """Entries in the vocabulary; the random 10% of masked positions draw uniformly from all of them, as the
    reference does."""
    cls_id: int
    """Id of [CLS], which opens every instance and is never a masking candidate."""
    sep_id: int
    """Id of [SEP], which closes each segment and is never a masking candidate."""
    mask_id: int
    """Id of [MASK], what 80% of the chosen positions become."""
    pad_id: int
    """Id of [PAD]; 0 when the vocabulary has none (BERT's vocab.txt puts it at 0)."""
    unk_id: int
    """Id of [UNK], counted by the build to check that the vocabulary fits the text."""
    is_continuation: np.ndarray
    """Bool over ids: True for "##" pieces, which whole-word masking groups with the word they continue."""

    def __post_init__(self) -> None:
        if self.is_continuation.shape != (self.vocab_size,):
            raise ValueError("is_continuation must be a bool array with one entry per vocabulary id")
        for name in ("cls_id", "sep_id", "mask_id"):
            v = getattr(self, name)
            if not 0 <= v < self.vocab_size:
                raise ValueError(f"{name}={v} is outside the vocabulary (size {self.vocab_size})")

    @property
    def token_dtype(self) -> np.dtype:
        # uint16 holds every id of a vocabulary up to 65,536 entries (BERT's is 30,522).
        return np.dtype(np.uint16) if self.vocab_size <= 65536 else np.dtype(np.uint32)

    @classmethod
    def from_tokens(cls, tokens: list[str]) -> VocabInfo:
        index = {t: i for i, t in enumerate(tokens)}
        missing = [t for t in ("[CLS]", "[SEP]", "[MASK]", "[UNK]") if t not in index]
        if missing:
            raise ValueError(f"vocabulary lacks special tokens {missing}; a BERT vocab.txt must contain them")
        return cls(
            vocab_size=len(tokens),
            cls_id=index["[CLS]"],
            sep_id=index["[SEP]"],
            mask_id=index["[MASK]"],
            pad_id=index.get("[PAD]", 0),
            unk_id=index["[UNK]"],
            is_continuation=np.array([t.startswith("##") for t in tokens], dtype=np.bool_),
        )

    @classmethod
    def from_vocab_file(cls, path: str | Path) -> VocabInfo:
        """From a BERT vocab.txt, without loading a tokenizer (e.g. in the driver)."""
        with open(path, encoding="utf-8") as f:
            tokens = [line.rstrip("\r\n") for line in f]
        while tokens and tokens[-1] == "":
            tokens.pop()
        return cls.from_tokens(tokens)


def num_to_predict(seq_lengths: np.ndarray, masked_lm_prob: float, max_predictions_per_seq: int) -> np.ndarray:
    """Per sequence ``min(max_pred, max(1, round(len * prob)))``; np.rint is half-to-even like Python 3 round."""
    raw = np.rint(np.asarray(seq_lengths, dtype=np.float64) * masked_lm_prob).astype(np.int64)
    return np.minimum(max_predictions_per_seq, np.maximum(1, raw))


@dataclass
class MaskedBatch:
    """Masking result for sequences laid out back to back in one flat array."""

    input_ids: np.ndarray
    """The masked tokens, flat, in the same layout (and offsets) as the input."""
    positions: np.ndarray
    """Masked positions within their sequence, flat, sorted per sequence (the reference sorts them)."""
    labels: np.ndarray
    """The original ids at ``positions``: the MLM targets."""
    counts: np.ndarray
    """Masked positions per sequence, to split ``positions`` and ``labels`` back into sequences."""


def mask_sequences(
    tokens: np.ndarray,
    offsets: np.ndarray,
    a_lengths: np.ndarray,
    vocab: VocabInfo,
    rng: np.random.Generator,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    whole_word_mask: bool = False,
) -> MaskedBatch:
    """Mask ``[CLS] A [SEP] B [SEP]`` sequences stored back to back: sequence i is
    ``tokens[offsets[i]:offsets[i + 1]]`` with ``a_lengths[i]`` tokens in A.

    Draw order (token mode): an (n, longest) matrix of uniform keys, then ``max_predictions_per_seq`` integers per
    sequence (the instance builder draws the same shapes per document pass, with max_seq_length columns).
    The specials are found by position (0, len(A) + 1, last), never by token value, as the reference's
    candidates exclude exactly those three positions.
    """
    n_seq = len(offsets) - 1
    lengths = np.diff(offsets)
    a_lengths = np.asarray(a_lengths, dtype=np.int64)
    k = num_to_predict(lengths, masked_lm_prob, max_predictions_per_seq)
    if n_seq == 0:
        empty = np.zeros(0, dtype=np.int64)
        return MaskedBatch(tokens.copy(), empty, tokens[:0].copy(), empty)
    if whole_word_mask:
        chosen = _choose_whole_words(tokens, offsets, a_lengths, vocab, rng, k)
        seq_chosen = np.repeat(np.arange(n_seq), lengths)[chosen]
        positions = chosen - offsets[seq_chosen]
        counts = np.bincount(seq_chosen, minlength=n_seq)
    else:
        keys = rng.random((n_seq, int(lengths.max())))
        rows, positions = choose_positions(keys, lengths, a_lengths, k)
        chosen = offsets[rows] + positions
        counts = np.bincount(rows, minlength=n_seq)
        # max_predictions_per_seq draws per sequence, the r-th chosen position of row i taking draw (i, r), as the
        # instance builder does.
        block = rng.integers(0, 10 * vocab.vocab_size, (n_seq, max_predictions_per_seq))
        rank = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
        draws = block[rows, rank]
        out, labels = apply_masks(tokens, chosen, draws, vocab)
        return MaskedBatch(input_ids=out, positions=positions, labels=labels, counts=counts)
    draws = rng.integers(0, 10 * vocab.vocab_size, len(chosen))
    out, labels = apply_masks(tokens, chosen, draws, vocab)
    return MaskedBatch(input_ids=out, positions=positions, labels=labels, counts=counts)


def apply_masks(tokens: np.ndarray, chosen: np.ndarray, draws: np.ndarray,
                vocab: VocabInfo) -> tuple[np.ndarray, np.ndarray]:
    """(masked copy of tokens, original ids at ``chosen``) given one integer draw in [0, 10 * vocab_size) per
    chosen position: ``draw % 10`` 0-7 -> [MASK] (80%), 8 -> keep (10%), 9 -> ``draw // 10``, a uniformly random
    vocabulary id (10%); kind and id are independent."""
    kind = draws % 10
    labels = tokens[chosen]
    replacement = labels.copy()
    replacement[kind < 8] = vocab.mask_id
    is_random = kind == 9
    replacement[is_random] = draws[is_random] // 10
    out = tokens.copy()
    out[chosen] = replacement
    return out, labels


def choose_positions(
    keys: np.ndarray, lengths: np.ndarray, a_lengths: np.ndarray, k: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(row, position) of each sequence's k smallest keys among its candidates, row-major (positions sorted per
    sequence). ``keys`` is an (n, width) matrix of uniform [0, 1) keys, row i for sequence i, whose first
    ``lengths[i]`` entries belong to its tokens (the rest is ignored; it is overwritten).

    Sorting the key *values* row-wise gives each row's k-th smallest key, and everything at or below it is chosen:
    cheaper than argsort + gather + sort. A row with fewer candidates than k takes all of them, as the reference.
    """
    n, width = keys.shape
    rows = np.arange(n)
    lengths = np.asarray(lengths, dtype=np.int64)
    keys[np.arange(width)[None, :] >= lengths[:, None]] = _SPECIAL_SORT_KEY  # past the end
    keys[:, 0] = _SPECIAL_SORT_KEY  # [CLS]
    keys[rows, a_lengths + 1] = _SPECIAL_SORT_KEY  # middle [SEP]
    keys[rows, lengths - 1] = _SPECIAL_SORT_KEY  # final [SEP]
    kmax = int(k.max()) if n else 0
    # Only the kmax smallest of a row matter: a partition, then a sort of those few.
    smallest = np.partition(keys, kmax - 1, axis=1)[:, :kmax] if 0 < kmax < width else keys.copy()
    smallest.sort(axis=1)
    kth = smallest[rows, np.minimum(k, smallest.shape[1]) - 1]
    chosen = (keys <= kth[:, None]) & (keys < 1.0)
    expected = np.minimum(k, lengths - 3)
    if int(chosen.sum()) != int(expected.sum()):
        # Two equal keys at a row's k-th value (odds ~1e-12 per row): fall back to exact ranks, lowest index first.
        order = np.argsort(keys, axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.broadcast_to(np.arange(width), (n, width)), axis=1)
        chosen = (rank < k[:, None]) & (keys < 1.0)
    r, c = np.nonzero(chosen)
    return r, c


def _choose_whole_words(
    tokens: np.ndarray,
    offsets: np.ndarray,
    a_lengths: np.ndarray,
    vocab: VocabInfo,
    rng: np.random.Generator,
    k: np.ndarray,
) -> np.ndarray:
    """Global positions chosen with whole-word groups, following the reference's greedy skip rule."""
    seq_of = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    is_candidate = np.ones(len(tokens), dtype=bool)
    is_candidate[offsets[:-1]] = False
    is_candidate[offsets[:-1] + a_lengths + 1] = False
    is_candidate[offsets[1:] - 1] = False
    cont = vocab.is_continuation[tokens]
    prev_cand = np.concatenate(([False], is_candidate[:-1]))
    starts = is_candidate & (~cont | ~prev_cand)
    group_of = np.cumsum(starts) - 1  # valid only where is_candidate
    n_groups = int(starts.sum())
    group_pos = np.flatnonzero(starts)
    group_seq = seq_of[group_pos]
    group_size = np.bincount(group_of[is_candidate], minlength=n_groups)
    keys = rng.random(n_groups)
    order = np.argsort(group_seq + keys / 2.0)
    sizes = group_size[order]
    seqs = group_seq[order]
    # Taken in shuffled order until a group overshoots: a per-sequence running sum decides the prefix.
    csum = np.cumsum(sizes)
    seq_first = np.searchsorted(seqs, np.arange(len(offsets) - 1), side="left")
    before = np.concatenate(([0], csum))[seq_first]
    running = csum - before[seqs]
    take = running <= k[seqs]
    # Past the first overshoot every running sum exceeds k; the reference keeps scanning for groups that still
    # fit, which only a short Python loop over that sequence's remaining groups can reproduce (whole-word mode only).
    over_idx = np.flatnonzero(~take)
    if len(over_idx):
        seq_over, first = np.unique(seqs[over_idx], return_index=True)
        seq_end = np.searchsorted(seqs, seq_over, side="right")
        for s, j, end in zip(seq_over.tolist(), over_idx[first].tolist(), seq_end.tolist(), strict=False):
            total = int(running[j] - sizes[j])
            target = int(k[s])
            for g in range(j, end):
                if total >= target:
                    break
                size = int(sizes[g])
                if total + size <= target:
                    take[g] = True
                    total += size
    chosen_groups = np.zeros(n_groups, dtype=bool)
    chosen_groups[order[take]] = True
    in_chosen = np.zeros(len(tokens), dtype=bool)
    in_chosen[is_candidate] = chosen_groups[group_of[is_candidate]]
    return np.flatnonzero(in_chosen)
