"""Sequence packing for the training loader: whole dataset rows laid end to end in fixed-width packed rows.

At seq 512 a padded batch is mostly padding when sequences are short (docs/benchmarks.md § Phase 2 has the figure
for our corpora); packing fills each (W)-position row with up to S whole sequences instead, so every micro-batch has
one static shape (B, W) and `torch.compile` compiles once. The model keeps each sequence exactly BERT
(`bert_core.packing`: positions restart, attention stays inside each sequence, NSP at each [CLS]).

How rows are packed, reproducibly: the global stream (`pretraining.order`) is cut into windows of `window_rows`
rows; a window is packed on its own (best-fit decreasing on length: longest rows first, each into the open packed
row it fills most tightly, ties broken by a seeded draw; at most S sequences and P masked slots per packed row), the
packed rows are shuffled (seeded by (seed, window)) and cut into global batches of B packed rows, which the ranks
share. The last batch of a window is completed with empty packed rows (lengths 0, no labels), which counts as
padding. No row is dropped or split. Every worker packs every window the same way, whatever their number.

Resume: the stream position is (window, batches consumed in it), the same on every rank and for every world size.
The loop saves it in the checkpoint; a run resumed without it re-packs the windows from the start of the stream to
find it (exact, but reads the data again).

A micro-batch is a dict of int64 numpy arrays:
    input_ids, token_type_ids, attention_mask (B, W)   attention_mask: 1 at real tokens (for metrics; the model
                                                       reads the blocks from sequence_lengths)
    sequence_lengths, next_sentence_label (B, S)       length 0 and label -100 at unused places
    masked_lm_positions, masked_lm_labels (B, P)       positions into the packed row; -100 in padding slots
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from bert_core.losses import IGNORE_INDEX
from corpus.ragged import ragged_indices


@dataclass(frozen=True)
class PackConfig:
    width: int
    """W: positions per packed row (`DataConfig.pack_width`, by default the dataset's max_seq_length)."""
    sequences: int
    """S: at most this many whole sequences per packed row."""
    slots: int
    """P: masked-LM slots per packed row; a sequence whose masks would overflow them goes to another packed row."""
    window_rows: int
    """Dataset rows packed together: each window is packed on its own, the same way on every worker."""

    def __post_init__(self) -> None:
        if self.width < 8 or self.sequences < 1 or self.slots < 1 or self.window_rows < 1:
            raise ValueError(f"packing needs width >= 8 and sequences, slots, window rows >= 1, got {self}")


def pack(lengths: np.ndarray, slots: np.ndarray, cfg: PackConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """Best-fit decreasing: the indices of the rows in each packed row, longest first. Open packed rows are kept by
    free positions, so each row goes to the tightest one with room (and with room for its slots and one more
    sequence) in a few array operations rather than a scan of every open packed row."""
    if len(lengths) and int(lengths.max()) > cfg.width:
        raise ValueError(f"a row of {int(lengths.max())} tokens does not fit a packed row of {cfg.width}")
    if len(slots) and int(slots.max()) > cfg.slots:
        raise ValueError(f"a row has {int(slots.max())} masked positions, more than the {cfg.slots} slots of a "
                         "packed row; raise the packed row's slots")
    order = np.lexsort((rng.random(len(lengths)), -lengths))
    by_free: list[list[int]] = [[] for _ in range(cfg.width + 1)]  # open packed rows by free positions
    count = np.zeros(cfg.width + 1, dtype=np.int64)
    members: list[list[int]] = []
    free: list[int] = []
    used_slots: list[int] = []
    for i in order:
        n, k = int(lengths[i]), int(slots[i])
        target = -1
        for space in np.flatnonzero(count[n:]) + n:  # tightest first; more than one only when slots run out
            for j, p in enumerate(by_free[space]):
                if used_slots[p] + k <= cfg.slots:
                    target = p
                    del by_free[space][j]
                    count[space] -= 1
                    break
            if target >= 0:
                break
        if target < 0:
            target = len(members)
            members.append([])
            free.append(cfg.width)
            used_slots.append(0)
        members[target].append(int(i))
        free[target] -= n
        used_slots[target] += k
        if len(members[target]) < cfg.sequences and free[target] > 0:
            by_free[free[target]].append(target)
            count[free[target]] += 1
    return [np.asarray(m, dtype=np.int64) for m in members]


def collate_packed(rows, packs: list[np.ndarray], batch_rows: int, cfg: PackConfig,
                   pad_id: int = 0) -> dict[str, np.ndarray]:
    """`packs` (at most `batch_rows` lists of indices into `rows`, a `pretraining.rows.Rows`) -> one packed
    micro-batch of `batch_rows` packed rows, the missing ones empty."""
    b, w, s, p = batch_rows, cfg.width, cfg.sequences, cfg.slots
    if len(packs) > b:
        raise ValueError(f"{len(packs)} packed rows do not fit a micro-batch of {b}")
    flat = np.concatenate(packs) if packs else np.zeros(0, np.int64)
    taken = rows.take(flat)
    lengths, n_slots = taken.lengths, np.diff(taken.pos_off)
    per_pack = np.asarray([len(x) for x in packs] + [0] * (b - len(packs)), dtype=np.int64)
    pack_of = np.repeat(np.arange(b), per_pack)
    place = np.arange(len(flat)) - np.repeat(np.cumsum(per_pack) - per_pack, per_pack)  # place within its pack
    sequence_lengths = np.zeros((b, s), dtype=np.int64)
    sequence_lengths[pack_of, place] = lengths
    starts = np.cumsum(sequence_lengths, axis=1) - sequence_lengths  # each sequence's [CLS] within its pack
    used = sequence_lengths.sum(axis=1)

    cols = np.arange(w)
    attention_mask = cols[None, :] < used[:, None]
    input_ids = np.full((b, w), pad_id, dtype=np.int64)
    input_ids[attention_mask] = taken.ids  # row-major order = the packs' sequences, in order
    # Segment B starts after [CLS] A [SEP] (a_length + 2 positions) of each sequence.
    seq_start = np.repeat(starts[pack_of, place], lengths)
    b_start = seq_start + np.repeat(taken.a_length + 2, lengths)
    local = ragged_indices(np.zeros(len(lengths), np.int64), lengths)  # position within the own sequence
    token_type_ids = np.zeros((b, w), dtype=np.int64)
    token_type_ids[attention_mask] = (seq_start + local >= b_start).astype(np.int64)

    slots_per_pack = np.bincount(pack_of, weights=n_slots, minlength=b).astype(np.int64)
    slot_mask = np.arange(p)[None, :] < slots_per_pack[:, None]
    positions = np.zeros((b, p), dtype=np.int64)
    labels = np.full((b, p), IGNORE_INDEX, dtype=np.int64)
    positions[slot_mask] = taken.pos + np.repeat(starts[pack_of, place], n_slots)
    labels[slot_mask] = taken.lab
    nsp = np.full((b, s), IGNORE_INDEX, dtype=np.int64)
    nsp[pack_of, place] = taken.nsp
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask.astype(np.int64),
        "token_type_ids": token_type_ids,
        "sequence_lengths": sequence_lengths,
        "masked_lm_positions": positions,
        "masked_lm_labels": labels,
        "next_sentence_label": nsp,
    }


def packed_batches(windows: Iterable, cfg: PackConfig, batch_size: int, seed_of, first_window: int = 0,
                   skip: int = 0, remask=None) -> Iterator[tuple[object, list[np.ndarray], tuple[int, int]]]:
    """The global batches of packed rows from an iterable of windows (`Rows` of `cfg.window_rows` rows, window
    `first_window` first): (the window's rows, the batch's packed rows as index arrays into them (at most
    `batch_size`; the last batch of a window is short, completed with empty packed rows when collated), the stream
    position after the batch: (window, batches taken in it)).

    The first `skip` batches are dropped, across windows if need be (resume: a saved position's count, or the whole
    count from window 0 when none was saved; skipped windows are packed but not collated). `seed_of(name, window)`
    derives the seeds; `remask(rows)`, optional, redraws the masks of a window's rows before it is packed (the
    packing depends on the masked counts)."""
    for w, rows in enumerate(windows, start=first_window):
        if remask is not None:
            rows = remask(rows)
        rng = np.random.default_rng(seed_of("pack", w))
        packs = pack(rows.lengths, np.diff(rows.pos_off), cfg, rng)
        packs = [packs[i] for i in rng.permutation(len(packs))]
        batches = [packs[i:i + batch_size] for i in range(0, len(packs), batch_size)]
        first, skip = min(skip, len(batches)), max(0, skip - len(batches))
        for j in range(first, len(batches)):
            yield rows, batches[j], (w, j + 1)


__all__ = ["PackConfig", "pack", "collate_packed", "packed_batches"]
