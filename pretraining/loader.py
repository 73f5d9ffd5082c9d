"""The training loader: from a built dataset's balanced Parquet shards to this rank's padded batches, the same
sequence of batches on every run. `DataConfig` is its one config.

The training loop needs three things the shards do not give by themselves:

* **Equal batch counts on every rank.** Each rank reads an infinite, deterministic stream: epoch `e` is the shards
  in a seeded order (same permutation on every rank), cut into `world` contiguous parts (sizes differ by at most
  one row); rank `r` reads its part of epoch 0, then of epoch 1, ... A micro-batch that straddles an epoch boundary
  is completed with the first rows of the next epoch (wrap around), so no row is dropped or padded away and every
  rank yields exactly as many batches as it is asked for: nothing can hang at the end of an epoch.
* **Resume.** A rank's position is just the number of micro-batches it consumed; `RankStream(start_batch=b)`
  re-derives the epoch, shard and row from it, so a resumed run sees exactly the batches an uninterrupted one would.
  (This is why pre-training has one loader and it is not Ray Data's: a Ray Data shard's rows depend on timing, so
  a resumed run could only skip as many rows as were consumed, not replay the same ones; and the stream's data
  wait measured 0.06% of a step, docs/benchmarks.md.)
* **Few shapes, little padding.** Batches are padded to the smallest of `DataConfig.length_buckets` that fits
  (`pretraining.batching.collate`). Length bucketing sorts a window of `bucket_window` micro-batches by length before
  cutting it, then shuffles the batches (seeded), so rows of a batch have similar lengths and the smallest width
  that fits wastes little.

With `dynamic_masking` every batch is re-masked (`pretraining.batching.Remasker`) from an RNG seeded by (seed, rank,
batch index): reproducible and independent of timing. Batches are made in a background thread (`Prefetcher`).
A new step of the stream (e.g. sequence packing) is a `DataConfig` field and a stage in `micro_batches`.

With `DataConfig.packing` the rows are packed instead of padded (`pretraining.packing`): whole sequences laid end to
end in fixed-width rows, one shape for every micro-batch. Packed windows yield a data-dependent number of batches,
so the stream also reports its position (window, micro-batches taken in it: `Batches.position`), which the
checkpoint keeps per rank for an exact resume (without it the stream re-packs its windows from the start).
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.rng import derive_seed as seed_for  # one seed derivation for the whole pipeline
from pipeline.schema import Manifest
from pipeline.storage import storage_options
from pretraining.batching import Remasker, collate, finite_batches
from pretraining.packing import PackConfig, packed_micro_batches
from pretraining.rows import Rows, read_shard



def default_length_buckets(max_seq_length: int, count: int = 4) -> tuple[int, ...]:
    """`count` widths, multiples of max_seq_length / count rounded up to 8: few shapes for torch.compile."""
    step = -(-max_seq_length // count)
    step = -(-step // 8) * 8
    widths = sorted({min(max_seq_length, step * i) for i in range(1, count + 1)} | {max_seq_length})
    return tuple(widths)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """This job's training stream: the dataset (its typed manifest: shards, lengths, vocabulary), batch geometry
    per rank, bucketing and masking."""

    train: Manifest
    endpoint_url: str | None = None  # S3-compatible endpoint of s3:// datasets (train and eval); credentials: the env
    micro_batch_size: int
    accum: int = 1  # micro-batches per optimizer step on each rank
    length_bucketing: bool = True
    bucket_window: int = 32
    # Sequence widths a batch is padded to (the smallest that fits its longest row). Empty: the defaults from
    # max_seq_length. A fixed set keeps torch.compile to one graph per width.
    length_buckets: tuple[int, ...] = ()
    dynamic_masking: bool = False
    mask_id: int = 103
    masked_lm_prob: float = 0.15
    # Packing (pretraining.packing): micro_batch_size packed rows of pack_width positions (0: max_seq_length; wider
    # rows are allowed, positions restart per sequence), each holding up to pack_sequences whole sequences and
    # pack_slots masked-LM slots (0: max_predictions per max_seq_length of width, + pack_sequences), packed per
    # window of pack_window_rows dataset rows (0: bucket_window x micro_batch_size x pack_sequences).
    packing: bool = False
    pack_width: int = 0
    pack_sequences: int = 3
    pack_slots: int = 0
    pack_window_rows: int = 0

    def __post_init__(self) -> None:
        if self.packing and (self.pack_sequences < 1 or self.pack_slots < 0 or self.pack_window_rows < 0):
            raise ValueError(f"--pack-sequences ({self.pack_sequences}) must be >= 1, pack_slots "
                             f"({self.pack_slots}) and pack_window_rows ({self.pack_window_rows}) >= 0")
        if self.packing and self.pack_width and self.pack_width < self.train.max_seq_length:
            raise ValueError(f"--pack-width {self.pack_width} is narrower than the dataset's max_seq_length "
                             f"{self.train.max_seq_length}: use 0 (that length) or more")
        if self.micro_batch_size < 1 or self.accum < 1:
            raise ValueError(f"micro_batch_size ({self.micro_batch_size}) and accum ({self.accum}) must be >= 1")
        if self.bucket_window < 1:
            raise ValueError("bucket_window must be >= 1")
        if not self.length_buckets:
            object.__setattr__(self, "length_buckets", default_length_buckets(self.train.max_seq_length))
        b = tuple(int(x) for x in self.length_buckets)
        if list(b) != sorted(set(b)) or b[0] < 1:
            raise ValueError(f"--length-buckets {b}: give increasing positive widths, e.g. 32,64,96,128")
        if b[-1] < self.train.max_seq_length:
            raise ValueError(f"--length-buckets {b}: the largest must be >= the dataset's max_seq_length "
                             f"{self.train.max_seq_length}, or the longest rows would not fit")
        object.__setattr__(self, "length_buckets", b)
        if not 0 < self.masked_lm_prob < 1:
            raise ValueError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")

    @property
    def window(self) -> int:
        """Micro-batches sorted together by length (1 without bucketing)."""
        return self.bucket_window if self.length_bucketing else 1

    @property
    def pack_geometry(self) -> PackConfig | None:
        """The packed rows' geometry (None without packing): W, S, P and the window, defaults filled in. A row that
        would exceed P goes to another packed row, never truncated."""
        if not self.packing:
            return None
        width, seq = self.pack_width or self.train.max_seq_length, self.train.max_seq_length
        # The builder masks round(15% of a row) (at least 1), capped at max_predictions: for full rows the cap,
        # scaled to the packed width, plus one for each sequence's rounding.
        slots = self.pack_slots or -(-self.train.max_predictions * width // seq) + self.pack_sequences
        return PackConfig(width=width, sequences=self.pack_sequences, slots=slots,
                          window_rows=self.pack_window_rows or self.bucket_window * self.micro_batch_size
                          * self.pack_sequences)


def batch_geometry(batch_size: int, num_workers: int, micro_batch_size: int | None = None) -> tuple[int, int]:
    """(micro-batch size, accumulation steps) of each rank for a global batch of `batch_size` sequences."""
    if batch_size % num_workers:
        raise ValueError(f"--batch-size {batch_size} does not split over {num_workers} workers; "
                         f"use a multiple of {num_workers}")
    per_worker = batch_size // num_workers
    micro = micro_batch_size or per_worker
    if micro < 1 or per_worker % micro:
        raise ValueError(f"--micro-batch-size {micro} must divide the {per_worker} sequences each worker gets per "
                         "step (--batch-size / --num-workers)")
    return micro, per_worker // micro


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Held-out data for eval_* metrics; `every` = 0: only at the end."""

    data: Manifest
    sequences: int = 2048  # the first N sequences (0: all)
    every: int = 0
    batch_size: int = 64

    def __post_init__(self) -> None:
        if self.sequences < 0 or self.every < 0 or self.batch_size < 1:
            raise ValueError("--eval-sequences and --eval-every must be >= 0 and the eval batch size >= 1")


# ---- the deterministic per-rank stream ------------------------------------------------------------------------------

def epoch_shard_order(num_shards: int, seed: int, epoch: int) -> np.ndarray:
    """The shards' order in `epoch`: the same seeded permutation on every rank."""
    return np.random.default_rng(seed_for("shard-order", seed, epoch)).permutation(num_shards)


def rank_segments(shard_rows: Sequence[int], seed: int, epoch: int, rank: int, world: int,
                  ) -> list[tuple[int, int, int]]:
    """Rank `rank`'s contiguous part of `epoch` as (shard index, first row, end row) pieces, in reading order."""
    order = epoch_shard_order(len(shard_rows), seed, epoch)
    total = int(sum(shard_rows))
    lo, hi = rank * total // world, (rank + 1) * total // world
    out, base = [], 0
    for s in order:
        n = int(shard_rows[s])
        a, b = max(lo, base), min(hi, base + n)
        if a < b:
            out.append((int(s), a - base, b - base))
        base += n
    return out


class RankStream:
    """This rank's infinite sequence of collated micro-batches, starting at micro-batch `start_batch`.

    `load_shard(i)` returns shard `i` of `data.train` as `Rows` (the caller owns storage: local, s3, ...). Every
    rank must be built with the same data and seed; each reads only its own part of each epoch.
    """

    def __init__(self, data: DataConfig, load_shard: Callable[[int], Rows], seed: int, rank: int = 0,
                 world: int = 1, start_batch: int = 0, remasker: Remasker | None = None,
                 start_position: tuple[int, int] | None = None) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world of size {world}")
        self.shard_rows = [int(n) for n in data.train.shard_rows]
        total = sum(self.shard_rows)
        if total < world:
            raise ValueError(f"the dataset has {total} rows, fewer than the {world} ranks reading it")
        self.data, self.seed, self.rank, self.world, self.remasker = data, seed, rank, world, remasker
        self._load, self._cache = load_shard, {}
        self.rank_rows = (rank + 1) * total // world - rank * total // world
        self._first_window, self._skip = divmod(start_batch, data.window)
        self._window_rows = data.window * data.micro_batch_size
        if data.packing:  # packed windows yield data-dependent batch counts: a saved position, or replay
            self._window_rows = data.pack_geometry.window_rows
            self._first_window, self._skip = start_position if start_position is not None else (0, start_batch)
        self.batch_index = start_batch

    def _shard(self, i: int) -> Rows:
        if i not in self._cache:
            self._cache = {i: self._load(i)}  # segments walk shards in order: one cached shard is enough
        return self._cache[i]

    def _rows_from(self, start: int) -> Iterator[Rows]:
        """The rank's rows from stream row `start` on, epoch after epoch, in pieces."""
        epoch, offset = divmod(start, self.rank_rows)
        while True:
            for s, a, b in rank_segments(self.shard_rows, self.seed, epoch, self.rank, self.world):
                if offset >= b - a:
                    offset -= b - a
                    continue
                yield self._shard(s).slice(a + offset, b)
                offset = 0
            epoch += 1

    def positioned(self) -> Iterator[tuple[dict[str, np.ndarray], tuple[int, int] | None]]:
        """(micro-batch, stream position after it): (window, batches taken in it) when packing, else None (the
        batch count is the position)."""
        pieces = self._rows_from(self._first_window * self._window_rows)
        if self.data.packing:
            yield from packed_batches(pieces, self.data, self.seed, self.rank, self._first_window, self._skip,
                                      self.remasker)
            return
        for batch in micro_batches(pieces, self.data, self.seed, self.rank, self._first_window, self._skip,
                                   self.remasker):
            yield batch, None

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for batch, _ in self.positioned():
            yield batch
            self.batch_index += 1


def micro_batches(pieces: Iterable[Rows], data: DataConfig, seed: int, rank: int = 0, first_window: int = 0,
                  skip: int = 0, remasker: Remasker | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Cut a stream of rows into collated micro-batches of exactly `data.micro_batch_size` rows.

    Rows are taken in windows of `bucket_window` micro-batches (1 without bucketing); with bucketing a window is
    sorted by length (random tie-break), cut, and its batches shuffled, all seeded by (seed, rank, window). The
    first `skip` batches of window `first_window` are dropped (resume); re-masking is seeded by the batch index.
    """
    m, max_predictions = data.micro_batch_size, data.train.max_predictions
    window_rows = data.window * m
    batch_index = first_window * data.window
    for w, rows in enumerate(_windows(pieces, window_rows), start=first_window):
        batches = [np.arange(i, i + m) for i in range(0, len(rows), m)]
        if data.length_bucketing:
            rng = np.random.default_rng(seed_for("bucket", seed, rank, w))
            by_len = np.argsort(rows.lengths + rng.random(len(rows)), kind="stable")
            batches = [by_len[i:i + m] for i in range(0, len(rows), m)]
            batches = [batches[j] for j in rng.permutation(len(batches))]
        for j, idx in enumerate(batches):
            if w == first_window and j < skip:
                batch_index += 1
                continue
            batch_rows = rows.take(idx)
            if remasker is not None:
                batch_rows = remasker(batch_rows, np.random.default_rng(seed_for("remask", seed, rank, batch_index)))
            yield collate(batch_rows, max_predictions, length_buckets=data.length_buckets)
            batch_index += 1


def packed_batches(pieces: Iterable[Rows], data: DataConfig, seed: int, rank: int = 0, first_window: int = 0,
                   skip: int = 0, remasker: Remasker | None = None,
                   ) -> Iterator[tuple[dict[str, np.ndarray], tuple[int, int]]]:
    """Packed micro-batches of `data.micro_batch_size` packed rows (`pretraining.packing`) and their positions; the
    first `skip` micro-batches from window `first_window` on are dropped. Re-masking, when on, is per window,
    before packing (the packing depends on the masked counts)."""
    def seed_of(name: str, window: int) -> int:
        return seed_for(name, seed, rank, window)

    return packed_micro_batches(_windows(pieces, data.pack_geometry.window_rows), data.pack_geometry, data.micro_batch_size, seed_of,
                                first_window, skip, remask=remasker)


def _windows(pieces: Iterable[Rows], window_rows: int) -> Iterator[Rows]:
    """Re-chunk a stream of row pieces into runs of exactly `window_rows` rows (a remainder waits for more)."""
    held, have = [], 0
    for piece in pieces:
        held.append(piece)
        have += len(piece)
        while have >= window_rows:
            rows = Rows.concat(held)
            yield rows.slice(0, window_rows)
            rest = rows.slice(window_rows, len(rows))
            held, have = ([rest] if len(rest) else []), len(rest)


class Prefetcher:
    """Runs an iterator in a background thread `depth` items ahead and measures how long the consumer waited.

    numpy and torch release the GIL in their kernels, so collation overlaps the model step. An exception in the
    producer is re-raised in the consumer.
    """

    _DONE = object()

    def __init__(self, source: Iterator, depth: int = 4) -> None:
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self.wait_seconds = 0.0
        self._thread = threading.Thread(target=self._run, args=(source,), daemon=True, name="batch-prefetch")
        self._thread.start()

    def _run(self, source: Iterator) -> None:
        try:
            for item in source:
                while not self._stop.is_set():
                    try:
                        self._q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._q.put(self._DONE)
        except BaseException as e:  # noqa: BLE001 (handed to the consumer)
            self._q.put(e)

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self):
        t0 = time.perf_counter()
        item = self._q.get()
        self.wait_seconds += time.perf_counter() - t0
        if item is self._DONE:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()


# ---- what the training loop calls ---------------------------------------------------------------------------------

def _load(shards: Manifest, endpoint_url: str | None) -> Callable[[int], Rows]:
    def load(i: int) -> Rows:
        url = shards.shard_urls[i]
        return read_shard(url, storage_options(url, endpoint_url))
    return load


class Batches(Prefetcher):
    """Prefetched micro-batches; `position` is the stream position after the last one taken (packed streams:
    (window, batches taken in it); None otherwise, where the batch count is the position)."""

    position: tuple[int, int] | None = None

    def __next__(self):
        batch, self.position = super().__next__()
        return batch


def gather_positions(batches: Batches) -> list | None:
    """Every rank's packed stream position, by rank (None when not packing). A collective when distributed: every
    rank must call it."""
    if batches.position is None:
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [batches.position]
    positions: list = [None] * dist.get_world_size()
    dist.all_gather_object(positions, batches.position)
    return positions


def rank_position(data_position: dict, rank: int, world: int) -> tuple[int, int] | None:
    """This rank's packed position from a checkpoint's `data_position` (None: not saved, or saved by another world
    size; a packed stream then replays its windows from the start to find the batch count)."""
    positions = data_position.get("packed_positions")
    if not positions or len(positions) != world:
        return None
    return tuple(positions[rank])


def _pinned(batches: Iterator[tuple[dict, object]]) -> Iterator[tuple[dict, object]]:
    """Page-locked torch tensors, made in the prefetch thread: the loop's host-to-GPU copies are then asynchronous
    and the pinning copy costs the training thread nothing."""
    import torch

    for batch, position in batches:
        yield {k: torch.from_numpy(v).pin_memory() for k, v in batch.items()}, position


def train_batches(data: DataConfig, vocab_size: int, seed: int, rank: int, world: int, start_batch: int,
                  pin_memory: bool = False,
                  start_position: tuple[int, int] | None = None) -> Batches:
    """This rank's micro-batches from `start_batch` (packed: from `start_position` when known) on, prefetched by a
    background thread (`.wait_seconds` is how long the loop waited for them); pinned torch tensors with
    `pin_memory` (for a GPU), else numpy arrays."""
    remasker = None
    if data.dynamic_masking:
        remasker = Remasker(vocab_size=vocab_size, mask_id=data.mask_id, max_predictions=data.train.max_predictions,
                            masked_lm_prob=data.masked_lm_prob)
    source = RankStream(data, _load(data.train, data.endpoint_url), seed, rank, world, start_batch, remasker,
                        start_position).positioned()
    return Batches(_pinned(source) if pin_memory else source, depth=max(4, 2 * data.accum))


def eval_rows(ev: EvalConfig, endpoint_url: str | None = None) -> Rows:
    """The first `ev.sequences` rows of the eval shards (all when 0), read whole: eval sets are small."""
    load, parts, have = _load(ev.data, endpoint_url), [], 0
    for i in range(len(ev.data.shard_urls)):
        parts.append(load(i))
        have += len(parts[-1])
        if ev.sequences and have >= ev.sequences:
            break
    return Rows.concat(parts)


def eval_batches(rows: Rows, ev: EvalConfig, batch_size: int, rank: int, world: int,
                 length_buckets: tuple[int, ...]) -> Iterator[dict]:
    return finite_batches(rows, batch_size, rank, world, ev.sequences or None, ev.data.max_predictions,
                          length_buckets=length_buckets)
