"""The global data order: which dataset rows optimizer step k trains on, the same whatever the number of workers.

The stream. Epoch e is every shard of the dataset in a seeded order (`epoch_shard_order`, the same permutation on
every worker), each shard's rows in file order; the stream is epoch 0, epoch 1, ... and never ends (a batch that
straddles an epoch's end takes the next epoch's first rows: nothing is dropped or padded away). An example's id is
its place in the dataset, `shard << 32 | row` (`example_id`); the stream also says which epoch it is read in, so
dynamic masking draws a new mask per epoch (`pretraining.batching.Remasker`, keyed by example).

Global batches. `DataConfig.batch_size` (B) rows per optimizer step, whatever the world size. The stream is cut
into windows of `bucket_window` batches (W B rows); a window is put in a seeded order (with length bucketing:
sorted by length, a seeded tie-break) and cut into W batches of B consecutive rows, taken in a seeded order. With
bucketing the rows of a batch have similar lengths, so padding to their longest wastes little; without, a batch is
W B rows' random B. Either way each epoch draws its batches anew.
Packed (`DataConfig.packing`): a window of rows is packed (`pretraining.packing`), its packed rows are put in a
seeded order and cut into batches of B packed rows, the last one completed with empty packed rows.

Dealing. Every worker computes the whole global batch (the length sort needs every row of the window, so each
worker reads every shard) and takes its share: rank r of n the rows [rB/n, (r+1)B/n) of the batch, cut into its
micro-batches. The share depends on n; the batch does not, so the examples of step k are the same on 1, 2 or 8
workers, a run resumed on another number of workers continues the same order, and so does an elastic run that
Ray Train resized. Every rank also knows the batch's totals (masked tokens, labelled sequences), so the loss is
the mean over the global batch whatever the split (`pretraining.step.train_step`), and its example ids (the
divergence guard names them; `python -m pretraining.batches` prints them).

Position: global batches consumed (the step plus the batches rollbacks skipped); packed, (window, batches taken in
it), since a packed window's batch count depends on the data. Neither depends on the world size.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from corpus.rng import derive_seed as seed_for
from pretraining.batching import Remasker, collate
from pretraining.packing import collate_packed, packed_batches
from pretraining.rows import Rows

SHARD_SHIFT = 32  # example id = shard << 32 | row: rows of a shard stay below 2**32


def example_id(shard: int | np.ndarray, row: int | np.ndarray) -> np.ndarray:
    return (np.asarray(shard, dtype=np.int64) << SHARD_SHIFT) | np.asarray(row, dtype=np.int64)


def split_example(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shard, row) of example ids."""
    ids = np.asarray(ids, dtype=np.int64)
    return ids >> SHARD_SHIFT, ids & ((1 << SHARD_SHIFT) - 1)


def digest(ids: np.ndarray) -> str:
    """The batch's identity: 16 hex digits of the sha256 of its sorted example ids (order-free)."""
    return hashlib.sha256(np.sort(np.asarray(ids, dtype="<i8")).tobytes()).hexdigest()[:16]


def epoch_shard_order(num_shards: int, seed: int, epoch: int) -> np.ndarray:
    """The shards' order in `epoch`: the same seeded permutation on every worker."""
    return np.random.default_rng(seed_for("shard-order", seed, epoch)).permutation(num_shards)


def stream_rows(shard_rows: Sequence[int], seed: int, load: Callable[[int], Rows], start: int = 0,
                ) -> Iterator[Rows]:
    """The stream from its row `start` on, epoch after epoch, in pieces (a shard's rest at a time), each row with
    its example id and epoch. `load(i)` reads shard i whole; one shard is held at a time."""
    total = int(sum(shard_rows))
    if total < 1:
        raise ValueError("the dataset has no rows")
    epoch, offset = divmod(start, total)
    while True:
        for s in epoch_shard_order(len(shard_rows), seed, epoch):
            n = int(shard_rows[s])
            if offset >= n:
                offset -= n
                continue
            rows = load(int(s))
            if len(rows) != n:
                raise ValueError(f"shard {int(s)} has {len(rows)} rows, but the dataset's manifest says {n}: the "
                                 "dataset changed after it was built; build it again")
            piece = rows.slice(offset, n)
            piece.example = example_id(int(s), np.arange(offset, n))
            piece.epoch = np.full(n - offset, epoch, dtype=np.int64)
            yield piece
            offset = 0
        epoch += 1


def windows(pieces: Iterable[Rows], window_rows: int) -> Iterator[Rows]:
    """Re-chunk a stream of row pieces into runs of exactly `window_rows` rows (a remainder waits for more)."""
    held, have = [], 0
    for piece in pieces:
        held.append(piece)
        have += len(piece)
        while have >= window_rows:
            rows = _concat(held)
            yield rows.slice(0, window_rows)
            rest = rows.slice(window_rows, len(rows))
            held, have = ([rest] if len(rest) else []), len(rest)


@dataclass
class Planned:
    """Rows known by their ids, lengths and masked counts only, not read yet: what the order needs. A shard's
    sidecar index (corpus/shard_index.py) gives them without reading the shard, so every worker computes the
    global order from the lengths and then reads, decodes, masks and collates only its own rows
    (`GlobalBatch.fetch`). It has the parts of `Rows`' interface the order uses (`lengths`, `pos_off`, `example`,
    `epoch`, `take`, `slice`, `concat`), so the order's code is one for both."""

    lengths: np.ndarray
    """(n,) tokens of each row, [CLS] and [SEP] included."""
    masked: np.ndarray
    """(n,) masked positions of each row, as it will be trained (dynamic masking: as redrawn)."""
    example: np.ndarray | None = None
    """(n,) example ids, `shard << 32 | row`."""
    epoch: np.ndarray | None = None
    """(n,) the epoch each row is read in."""

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def pos_off(self) -> np.ndarray:
        off = np.zeros(len(self.masked) + 1, np.int64)
        np.cumsum(self.masked, out=off[1:])
        return off

    def take(self, idx: np.ndarray) -> Planned:
        idx = np.asarray(idx, dtype=np.int64)
        return Planned(self.lengths[idx], self.masked[idx], None if self.example is None else self.example[idx],
                       None if self.epoch is None else self.epoch[idx])

    def slice(self, start: int, stop: int) -> Planned:
        return self.take(np.arange(start, stop))

    @staticmethod
    def concat(parts: Sequence[Planned]) -> Planned:
        if len(parts) == 1:
            return parts[0]

        def cat(name: str) -> np.ndarray | None:
            columns = [getattr(p, name) for p in parts]
            return None if any(c is None for c in columns) else np.concatenate(columns)

        return Planned(cat("lengths"), cat("masked"), cat("example"), cat("epoch"))


def _concat(parts: Sequence) -> Rows | Planned:
    return Planned.concat(parts) if isinstance(parts[0], Planned) else Rows.concat(parts)


@dataclass
class GlobalBatch:
    """One optimizer step's data, the same on every worker. Unpacked: `rows` are the batch's B rows in order.
    Packed: `rows` is the window's rows and `packs` the batch's packed rows (index arrays into `rows`, at most B:
    the missing ones are empty)."""

    rows: Rows | Planned
    """Unpacked: the batch's B rows in order; packed: the whole window's rows. `Planned` (ids, lengths and masked
    counts only) when the loader reads only its share: `fetch` reads the ones a rank trains."""
    position: int | tuple[int, int]
    """The stream position after this batch: global batches consumed, or packed (window, batches taken in it)."""
    packs: list[np.ndarray] | None = None
    """Packed: the batch's packed rows, each an index array into `rows` (at most B; the missing ones are empty);
    None unpacked."""
    fetch: Callable[[Planned], Rows] | None = None
    """With `Planned` rows: reads, decodes and (dynamic masking) re-masks the rows it is given, checking them
    against their plan; None when `rows` are read already."""

    def materialize(self, part: Rows | Planned) -> Rows:
        """`part` (rows of this batch) as `Rows`: itself when read already, else fetched."""
        if isinstance(part, Rows):
            return part
        if self.fetch is None:
            raise ValueError("a planned batch needs its fetch to be read")
        return self.fetch(part)

    @property
    def examples(self) -> np.ndarray:
        ids = self.rows.example
        return ids if self.packs is None else ids[np.concatenate(self.packs)] if self.packs else ids[:0]

    @property
    def totals(self) -> tuple[int, int]:
        """(masked tokens, labelled sequences) of the whole batch: the loss' denominators."""
        masked = np.diff(self.rows.pos_off)
        if self.packs is None:
            return int(masked.sum()), len(self.rows)
        flat = np.concatenate(self.packs) if self.packs else np.zeros(0, np.int64)
        return int(masked[flat].sum()), len(flat)


def global_batches(data, seed: int, load: Callable[[int], Rows | Planned], start: int = 0,
                   start_position: tuple[int, int] | None = None,
                   remasker: Remasker | None = None,
                   fetch: Callable[[Planned], Rows] | None = None) -> Iterator[GlobalBatch]:
    """The global batches from batch `start` on (packed: from `start_position` when known, else by replaying the
    windows from the first to find batch `start`). `data` is a `pretraining.loader.DataConfig`.

    `load(i)` gives shard i's rows: read whole (`Rows`; the batches then hold their rows, re-masked), or `Planned`
    from its index (the batches then hold ids, lengths and masked counts, and `fetch`, which reads and re-masks the
    rows a rank trains: `rank_share`). The order is the same either way: it depends on lengths and counts only."""
    shard_rows = data.train.shard_rows

    def remasked(rows):
        if remasker is None:
            return rows
        if isinstance(rows, Planned):  # the counts the remasker will draw, from the lengths alone
            return Planned(rows.lengths, remasker.counts(rows.lengths), rows.example, rows.epoch)
        return remasker(rows, seed)

    if data.packing:
        geometry = data.pack_geometry
        first_window, skip = start_position if start_position is not None else (0, start)

        def seed_of(name: str, window: int) -> int:
            return seed_for(name, seed, window)

        remask = None if remasker is None else remasked
        pieces = stream_rows(shard_rows, seed, load, first_window * geometry.window_rows)
        for rows, packs, position in packed_batches(windows(pieces, geometry.window_rows), geometry,
                                                    data.batch_size, seed_of, first_window, skip, remask):
            yield GlobalBatch(rows, position, packs, fetch)
        return
    per_window, b = data.bucket_window, data.batch_size
    first_window, skip = divmod(start, per_window)
    pieces = stream_rows(shard_rows, seed, load, first_window * per_window * b)
    for w, rows in enumerate(windows(pieces, per_window * b), start=first_window):
        rng = np.random.default_rng(seed_for("window", seed, w))
        ties = rng.random(len(rows))
        order = np.argsort(rows.lengths + ties, kind="stable") if data.length_bucketing else np.argsort(ties)
        batches = list(rng.permutation(per_window))
        for j, which in enumerate(batches):
            if w == first_window and j < skip:
                continue
            batch = rows.take(order[which * b:(which + 1) * b])
            yield GlobalBatch(remasked(batch), w * per_window + j + 1, None, fetch)


@dataclass
class RankShare:
    """What one rank trains of a global batch: its micro-batches (collated), the example ids of each, and where
    each starts in the global batch (its first row; dropout is seeded by it, so a micro-batch drops the same units
    whichever rank trains it)."""

    micro: list[dict[str, np.ndarray]]
    """This rank's `accum` micro-batches, collated (int64 numpy arrays; page-locked torch tensors once the loader
    pins them for a GPU)."""
    examples: list[np.ndarray]
    """The example ids (`shard << 32 | row`) each micro-batch holds."""
    starts: list[int]
    """Each micro-batch's first place in the global batch, which seeds its dropout (with the run's seed and the
    step): a micro-batch drops the same units whichever rank trains it."""
    batch: GlobalBatch
    """The global batch the share is cut from (its totals are the loss' denominators on every rank)."""


def share_bounds(batch_size: int, rank: int, world: int, accum: int) -> list[tuple[int, int]]:
    """Rank `rank`'s micro-batches as (first, end) places in the global batch: its share [rB/n, (r+1)B/n) cut into
    `accum` parts that differ by at most one row (shares differ by at most one when n does not divide B)."""
    lo, hi = rank * batch_size // world, (rank + 1) * batch_size // world
    if hi - lo < accum:
        raise ValueError(f"a worker's {hi - lo} rows of the batch cannot make {accum} micro-batches: raise "
                         "--batch-size or --micro-batch-size")
    cuts = [lo + i * (hi - lo) // accum for i in range(accum + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=False))


def rank_share(batch: GlobalBatch, data, rank: int, world: int, accum: int) -> RankShare:
    """Rank `rank` of `world`'s share of `batch` in `accum` micro-batches (`share_bounds`). Packed, the places are
    packed rows; those past the batch's last packed row are empty packed rows. A planned batch's rows are read,
    decoded and re-masked here, the rank's own only."""
    micro, examples, starts = [], [], []
    for first, end in share_bounds(data.batch_size, rank, world, accum):
        if batch.packs is None:
            part = batch.materialize(batch.rows.slice(first, end))
            micro.append(collate(part, data.train.max_predictions, length_buckets=data.length_buckets))
            examples.append(part.example)
        else:
            packs = batch.packs[first:end]
            if isinstance(batch.rows, Planned):  # read this micro-batch's rows only, its packs renumbered
                sizes = [len(p) for p in packs]
                rows = batch.materialize(batch.rows.take(np.concatenate(packs) if packs else np.zeros(0, np.int64)))
                packs = np.split(np.arange(len(rows)), np.cumsum(sizes)[:-1]) if packs else []
            else:
                rows = batch.rows
            micro.append(collate_packed(rows, packs, end - first, data.pack_geometry))
            examples.append(rows.example[np.concatenate(packs)] if packs else rows.example[:0])
        starts.append(first)
    return RankShare(micro, examples, starts, batch)


def order_key(data, seed: int) -> str:
    """What fixes which examples each step trains on (dataset, global batch, seed, bucketing window, packing): a
    checkpoint keeps it, so a resume that would train other examples per step says so."""
    pack = data.pack_geometry
    parts = (data.train.sha256, data.batch_size, seed, data.bucket_window, data.length_bucketing,
             (pack.width, pack.sequences, pack.slots, pack.window_rows) if pack else None)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def describe(ids: np.ndarray, limit: int = 32) -> str:
    """Example ids as `shard:row`, the first `limit` of them, sorted."""
    shard, row = split_example(np.sort(np.asarray(ids, dtype=np.int64)))
    named = " ".join(f"{int(s)}:{int(r)}" for s, r in zip(shard[:limit], row[:limit], strict=False))
    return named + (f" ... ({len(ids)} in all)" if len(ids) > limit else "")
