"""The training loader: from a built dataset's balanced Parquet shards to this rank's padded micro-batches of each
optimizer step, the same global order on every run and for any number of workers. `DataConfig` is its one config.

The order itself (which rows step k trains on, and each rank's share of them) is `pretraining.order`'s: the global
batch of `batch_size` rows is defined once, from the dataset, the seed and the data flags, and dealt to the ranks;
gradient accumulation absorbs the world size (`DataConfig.for_world`). What that gives the training loop:

* **Equal work on every rank.** Every rank yields exactly `accum` micro-batches per step, forever (the stream wraps
  into the next epoch): nothing can hang at the end of an epoch, and no row is dropped or padded away.
* **Resume anywhere.** The position is the number of global batches consumed (packed: (window, batches taken in
  it)), the same on every rank and for every world size: a resumed run, on the same or another number of workers,
  sees exactly the batches an uninterrupted one would. (This is why pre-training has one loader and it is not Ray
  Data's: a Ray Data shard's rows depend on timing, so a resumed run could only skip as many rows as were
  consumed, not replay the same ones; and the stream's data wait measured 0.06% of a step, docs/benchmarks.md.)
* **Few shapes, little padding.** Batches are padded to the smallest of `DataConfig.length_buckets` that fits
  (`pretraining.batching.collate`); length bucketing sorts a window of `bucket_window` global batches by length
  before cutting it, so the rows of a batch have similar lengths. With `DataConfig.packing` the rows are packed
  instead (`pretraining.packing`): one shape for every micro-batch.

With `dynamic_masking` rows are re-masked (`pretraining.batching.Remasker`) with random draws keyed by example and
epoch: reproducible, independent of timing, of the batch and of the world size. Steps are made in a background
thread (`Prefetcher`). A new step of the stream is a `DataConfig` field and a stage in `pretraining.order`.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from corpus.schema import Manifest
from pretraining.batching import Remasker, finite_batches, mask_counts
from pretraining.order import Planned, RankShare, global_batches, rank_share, split_example
from pretraining.packing import PackConfig
from pretraining.rows import Rows, read_shard
from pretraining.shard_reader import ShardReader
from storage.fs import storage_options

log = logging.getLogger(__name__)


def default_length_buckets(max_seq_length: int, count: int = 4) -> tuple[int, ...]:
    """`count` widths, multiples of max_seq_length / count rounded up to 8: few shapes for torch.compile."""
    step = -(-max_seq_length // count)
    step = -(-step // 8) * 8
    widths = sorted({min(max_seq_length, step * i) for i in range(1, count + 1)} | {max_seq_length})
    return tuple(widths)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """This job's training stream: the dataset (its typed manifest: shards, lengths, vocabulary), the global batch
    and a worker's share of it, bucketing and masking.

    `batch_size` (the global batch, rows per optimizer step; packed rows when packing) fixes the data order.
    `micro_batch_size` and `accum` are one worker's geometry for the world size the job planned for
    (`batch_size / (micro_batch_size x accum)` workers); `for_world(n)` gives it for n workers, the micro-batch never
    larger than the planned one (the memory plan's)."""

    train: Manifest
    """The training dataset's typed manifest (shards and their rows, sequence lengths, vocabulary); its sha256 is
    part of the data order's key (`pretraining.order.order_key`)."""
    endpoint_url: str | None = None
    """S3-compatible endpoint of s3:// datasets (train and eval); None: the S3 client's default. Credentials come
    from the environment, never from a config (it is logged)."""
    micro_batch_size: int
    """Rows one worker forwards at once (packed rows when packing): the memory plan's (`pretraining.memory`). It
    does not change the data order."""
    accum: int = 1
    """Micro-batches per optimizer step on each rank (gradient accumulation)."""
    batch_size: int = 0
    """Rows per optimizer step over all workers (packed rows when packing): it fixes the data order. 0:
    micro_batch_size x accum (one worker)."""
    length_bucketing: bool = True
    """Sort each window of `bucket_window` global batches by length before cutting it, so the rows of a batch have
    similar lengths and little padding; off: a batch is a random B of the window's rows."""
    bucket_window: int = 32
    """Global batches drawn together from the stream (sorted by length when bucketing), in a seeded order."""
    length_buckets: tuple[int, ...] = ()
    """Sequence widths a batch is padded to (the smallest that fits its longest row): a fixed set keeps
    torch.compile to one graph per width. Empty: multiples of max_seq_length / 4 rounded up to 8
    (`default_length_buckets`)."""
    dynamic_masking: bool = False
    """Redraw every row's MLM mask each time it is read (`pretraining.batching.Remasker`, keyed by example and
    epoch); off: the masks the dataset was built with."""
    mask_id: int = 103
    """The [MASK] token's id, for dynamic masking: 103 in Google's BERT vocabularies; the job passes the dataset's."""
    masked_lm_prob: float = 0.15
    """The share of each row's tokens that dynamic masking masks (rounded, at least 1, at most max_predictions):
    the BERT paper's 15%; the job passes the dataset's."""
    packing: bool = False
    """Pack whole sequences end to end into fixed-width rows instead of padding (`pretraining.packing`): one shape
    for every micro-batch. Off until a GPU run shows it winning (docs/benchmarks.md)."""
    pack_width: int = 0
    """Positions per packed row; 0: the dataset's max_seq_length. Wider rows are allowed (positions restart per
    sequence), narrower ones not."""
    pack_sequences: int = 3
    """At most this many whole sequences per packed row."""
    pack_slots: int = 0
    """Masked-LM slots per packed row; 0: max_predictions per max_seq_length of width, plus one per sequence for
    its rounding (a sequence that would overflow them goes to another packed row, never truncated)."""
    pack_window_rows: int = 0
    """Dataset rows packed together, each window on its own; 0: bucket_window x batch_size x pack_sequences."""

    def __post_init__(self) -> None:
        if self.packing and (self.pack_sequences < 1 or self.pack_slots < 0 or self.pack_window_rows < 0):
            raise ValueError(f"--pack-sequences ({self.pack_sequences}) must be >= 1, pack_slots "
                             f"({self.pack_slots}) and pack_window_rows ({self.pack_window_rows}) >= 0")
        if self.packing and self.pack_width and self.pack_width < self.train.max_seq_length:
            raise ValueError(f"--pack-width {self.pack_width} is narrower than the dataset's max_seq_length "
                             f"{self.train.max_seq_length}: use 0 (that length) or more")
        if self.micro_batch_size < 1 or self.accum < 1:
            raise ValueError(f"micro_batch_size ({self.micro_batch_size}) and accum ({self.accum}) must be >= 1")
        if not self.batch_size:
            object.__setattr__(self, "batch_size", self.micro_batch_size * self.accum)
        if self.batch_size < self.micro_batch_size * self.accum:
            raise ValueError(f"--batch-size {self.batch_size} is smaller than one worker's micro-batch x "
                             f"accumulation ({self.micro_batch_size} x {self.accum})")
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
                          window_rows=self.pack_window_rows or self.bucket_window * self.batch_size
                          * self.pack_sequences)

    def for_world(self, world: int) -> DataConfig:
        """This config's geometry for `world` workers: each takes B/n rows of a step (the shares differ by at most
        one row when n does not divide B), in `accum` micro-batches of at most `micro_batch_size` rows (this
        config's micro-batch is the most a worker's memory was planned for). The world the config was planned for
        gives itself."""
        b = self.batch_size
        if world < 1 or world > b:
            raise ValueError(f"--batch-size {b} cannot be shared by {world} workers: every worker needs a row "
                             "of each step; raise --batch-size or lower --num-workers")
        if b == world * self.micro_batch_size * self.accum:
            return self
        share = -(-b // world)  # the largest share
        accum = -(-share // self.micro_batch_size)
        if b // world < accum:
            raise ValueError(f"--batch-size {b} over {world} workers leaves {b // world} rows to some, fewer than "
                             f"their {accum} micro-batches: raise --batch-size or --micro-batch-size")
        return dataclasses.replace(self, micro_batch_size=-(-share // accum), accum=accum)


def batch_geometry(batch_size: int, num_workers: int, micro_batch_size: int | None = None,
                   most_workers: int | None = None) -> tuple[int, int]:
    """(micro-batch size, accumulation steps) of each rank for a global batch of `batch_size` sequences. An elastic
    run (`most_workers` above `num_workers`, its fewest) plans for its fewest workers, the largest shares: shares
    may then differ by one row, and `micro_batch_size` is the most a worker forwards at once."""
    if most_workers is not None and most_workers > num_workers:
        if batch_size < most_workers:
            raise ValueError(f"--batch-size {batch_size} cannot be shared by up to {most_workers} workers: every "
                             "worker needs a row of each step; raise --batch-size")
        per_worker = -(-batch_size // num_workers)
        accum = -(-per_worker // min(micro_batch_size or per_worker, per_worker))
        return -(-per_worker // accum), accum
    if batch_size % num_workers:
        raise ValueError(f"--batch-size {batch_size} does not split over {num_workers} workers; "
                         f"use a multiple of {num_workers}")
    per_worker = batch_size // num_workers
    micro = min(micro_batch_size or per_worker, per_worker)  # more than a worker's share: its share, in one go
    if micro < 1 or per_worker % micro:
        raise ValueError(f"--micro-batch-size {micro} must divide the {per_worker} sequences each worker gets per "
                         "step (--batch-size / --num-workers)")
    return micro, per_worker // micro


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Held-out data for eval_* metrics; `every` = 0: only at the end."""

    data: Manifest
    """The held-out dataset's typed manifest; `PretrainConfig` requires the training data's vocabulary."""
    sequences: int = 2048
    """Evaluate on the first N sequences of its shards (0: all)."""
    every: int = 0
    """Optimizer steps between evaluations, plus one at the end; 0: only at the end (the job's default spreads a few
    over the run)."""
    batch_size: int = 64
    """Rows per held-out batch (checked >= 1). `pretraining.loop` evaluates in batches of the training
    micro-batch (`DataConfig.micro_batch_size`) and does not read it."""

    def __post_init__(self) -> None:
        if self.sequences < 0 or self.every < 0 or self.batch_size < 1:
            raise ValueError("--eval-sequences and --eval-every must be >= 0 and the eval batch size >= 1")


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

    def __iter__(self) -> Prefetcher:
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
    def load(i: int) -> Rows:  # whole, and checked against the manifest's digest when the build recorded one
        shard = shards.shards[i]
        return read_shard(shard.url, storage_options(shard.url, endpoint_url), shard.sha256)
    return load


class Steps(Prefetcher):
    """This rank's share of each step (`pretraining.order.RankShare`), prefetched; `wait_seconds` is how long the
    loop waited for them."""


def _pinned(shares: Iterator[RankShare]) -> Iterator[RankShare]:
    """Page-locked torch tensors, made in the prefetch thread: the loop's host-to-GPU copies are then asynchronous
    and the pinning copy costs the training thread nothing."""
    import torch

    for share in shares:
        share.micro = [{k: torch.from_numpy(v).pin_memory() for k, v in batch.items()} for batch in share.micro]
        yield share


def remasker_for(data: DataConfig, vocab_size: int) -> Remasker | None:
    if not data.dynamic_masking:
        return None
    return Remasker(vocab_size=vocab_size, mask_id=data.mask_id, max_predictions=data.train.max_predictions,
                    masked_lm_prob=data.masked_lm_prob)


def masked_rule(data: DataConfig) -> Callable[[np.ndarray], np.ndarray] | None:
    """Each row's masked positions from its length alone, as the order needs them before a row is read: dynamic
    masking's draw (`Remasker.counts`), or the build's token-masking rule; None for a dataset built with
    whole-word masking and trained with its own masks (its counts are only in the rows: read whole)."""
    m = data.train
    if data.dynamic_masking:
        return lambda lengths: mask_counts(lengths, data.masked_lm_prob, m.max_predictions)
    if m.config.get("instances", {}).get("whole_word_mask", False):
        return None
    return lambda lengths: mask_counts(lengths, m.masked_lm_prob, m.max_predictions)


def share_reader(data: DataConfig, **options) -> ShardReader | None:
    """The reader of this rank's share (`pretraining.shard_reader`), or None where the shards must be read whole
    (a dataset built before shards had an index, or static whole-word masks), with one log line saying why."""
    rule = masked_rule(data)
    if not ShardReader.indexed(data.train):
        log.info("%s has no shard index (built before them): every worker reads every shard whole; rebuild it "
                 "to read only each worker's share", data.train.url)
        return None
    if rule is None:
        log.info("%s was built with whole-word masks, whose counts only its rows hold: every worker reads every "
                 "shard whole (--dynamic-masking reads only each worker's share)", data.train.url)
        return None
    window = data.pack_geometry.window_rows if data.packing else data.bucket_window * data.batch_size
    return ShardReader(data.train, data.endpoint_url, rule, **({"window_rows": window} | options))


def _own_part(batch, data: DataConfig, rank: int, world: int) -> Planned:
    """The planned rows of `batch` that rank `rank` of `world` trains."""
    lo, hi = rank * data.batch_size // world, (rank + 1) * data.batch_size // world
    if batch.packs is None:
        return batch.rows.slice(lo, hi)
    packs = batch.packs[lo:hi]
    return batch.rows.take(np.concatenate(packs) if packs else np.zeros(0, np.int64))


def rank_steps(data: DataConfig, vocab_size: int, seed: int, rank: int, world: int, start: int = 0,
               start_position: tuple[int, int] | None = None,
               reader: ShardReader | None | bool = True) -> Iterator[RankShare]:
    """Rank `rank` of `world`'s share of every step from global batch `start` on (packed: from `start_position`
    when known), unprefetched. `data` is the world's geometry (`DataConfig.for_world`).

    With shard indexes (`share_reader`; `reader` True: made here, or given, or False: read whole) the global order
    is computed from the rows' lengths and only this rank's rows are read, decoded, masked and collated; the row
    groups of the next `bucket_window` batches' rows are read ahead in background threads. Without, every shard is
    read whole (the same order and batches)."""
    remasker = remasker_for(data, vocab_size)
    if reader is True:
        reader = share_reader(data)
    if not reader:
        batches = global_batches(data, seed, _load(data.train, data.endpoint_url), start, start_position, remasker)
        for batch in batches:
            yield rank_share(batch, data, rank, world, data.accum)
        return

    def fetch(part: Planned) -> Rows:
        rows = reader.fetch(part)
        if remasker is not None:
            rows = remasker(rows, seed)
        counts = np.diff(rows.pos_off)
        if not np.array_equal(counts, part.masked):
            bad = int(split_example(part.example[np.flatnonzero(counts != part.masked)[0]])[0])
            raise ValueError(f"{data.train.shards[bad].url}: rows with other masked counts than the build's rule "
                             "gives: the dataset was changed after its build; rebuild it")
        return rows

    ahead: collections.deque = collections.deque()
    try:
        for batch in global_batches(data, seed, reader.planned, start, start_position, remasker, fetch):
            ahead.append((batch, reader.prefetch(_own_part(batch, data, rank, world))))
            if len(ahead) > data.bucket_window:
                batch, keys = ahead.popleft()
                share = rank_share(batch, data, rank, world, data.accum)
                reader.release(keys)
                yield share
    finally:
        reader.close()


def train_steps(data: DataConfig, vocab_size: int, seed: int, rank: int, world: int, start: int,
                pin_memory: bool = False, start_position: tuple[int, int] | None = None) -> Steps:
    """This rank's share of each step from global batch `start` on (packed: from `start_position` when known),
    prefetched by a background thread; pinned torch tensors with `pin_memory` (for a GPU), else numpy arrays."""
    source = rank_steps(data, vocab_size, seed, rank, world, start, start_position)
    return Steps(_pinned(source) if pin_memory else source, depth=2)


def train_batches(data: DataConfig, vocab_size: int, seed: int, rank: int = 0, world: int = 1,
                  start: int = 0) -> Prefetcher:
    """The micro-batches of `train_steps`, one after another (benchmarks, tools)."""
    source = (batch for share in rank_steps(data, vocab_size, seed, rank, world, start) for batch in share.micro)
    return Prefetcher(source, depth=max(4, 2 * data.accum))


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
