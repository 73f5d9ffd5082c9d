"""From balanced Parquet shards to padded training batches, the same sequence of batches on every run.

The training loop needs three things the shards do not give by themselves:

* **Equal batch counts on every rank.** Each rank reads an infinite, deterministic stream: epoch `e` is the shards
  in a seeded order (same permutation on every rank), cut into `world` contiguous parts (sizes differ by at most
  one row); rank `r` reads its part of epoch 0, then of epoch 1, ... A micro-batch that straddles an epoch boundary
  is completed with the first rows of the next epoch (wrap around), so no row is dropped or padded away and every
  rank yields exactly as many batches as it is asked for: nothing can hang at the end of an epoch.
* **Resume.** A rank's position is just the number of micro-batches it consumed; `RankStream(start_batch=b)`
  re-derives the epoch, shard and row from it, so a resumed run sees exactly the batches an uninterrupted one would.
* **Few shapes, little padding.** `collate` pads a batch to the smallest of a fixed set of widths
  (`length_buckets`, e.g. multiples of max_seq_length / 4) that holds its longest row, and its masked-LM slots to
  `max_predictions` (label -100 in padding): a compiled model then sees one shape per width, never a new one.
  Without buckets it pads to the longest row rounded up to a multiple of 8. Length bucketing sorts a window of
  `bucket_window` micro-batches by length before cutting it, then shuffles the batches (seeded), so rows of a
  batch have similar lengths and the smallest width that fits wastes little.

Optional dynamic re-masking (`Remasker`) restores the original ids and redraws the MLM positions with the rule the
builder used (15% of non-special positions, at most `max_predictions`, 80% [MASK] / 10% random / 10% kept), from an
RNG seeded by (seed, rank, batch index), so it is reproducible and independent of timing. It masks single word
pieces (the builder may have used whole-word masking; the statistics per position are the same).

Rows are kept columnar (Arrow's flat values + offsets), so gathering, re-masking and padding are numpy operations
with no Python loop over tokens. Outputs are numpy arrays; the training loop wraps them with `torch.from_numpy`.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from bert_core.losses import IGNORE_INDEX  # the label of padded MLM slots
from pipeline.ragged import ragged_indices
from pipeline.rng import derive_seed as seed_for  # one seed derivation for the whole pipeline
from pipeline.schema import SHARD_COLUMNS


def _gather_ragged(values: np.ndarray, offsets: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows `idx` of a ragged column (values + offsets), as a new values + offsets pair."""
    starts, lengths = offsets[idx], offsets[idx + 1] - offsets[idx]
    new_off = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_off[1:])
    return values[ragged_indices(starts, lengths)], new_off


@dataclass
class Rows:
    """A run of dataset rows, columnar. Ragged columns are flat `*_values` arrays with `(n + 1,)` offsets."""

    ids: np.ndarray
    ids_off: np.ndarray
    a_length: np.ndarray
    pos: np.ndarray
    pos_off: np.ndarray
    lab: np.ndarray
    nsp: np.ndarray

    def __len__(self) -> int:
        return len(self.a_length)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.ids_off)

    @classmethod
    def from_arrow(cls, table) -> "Rows":  # a pyarrow.Table with the schema's columns
        def ragged(name: str) -> tuple[np.ndarray, np.ndarray]:
            arr = table.column(name).combine_chunks()
            off = arr.offsets.to_numpy().astype(np.int64)
            vals = arr.values.to_numpy()[off[0]:off[-1]]  # a sliced array's values may extend past its rows
            return vals.astype(np.int64), off - off[0]

        ids, ids_off = ragged("input_ids")
        pos, pos_off = ragged("masked_lm_positions")
        lab, lab_off = ragged("masked_lm_ids")
        if not np.array_equal(pos_off, lab_off):
            raise ValueError("masked_lm_positions and masked_lm_ids have different lengths in some rows")
        return cls(ids, ids_off, table.column("a_length").to_numpy().astype(np.int64), pos, pos_off, lab,
                   table.column("next_sentence_label").to_numpy().astype(np.int64))

    @classmethod
    def from_pylist(cls, rows: Sequence[dict]) -> "Rows":
        """From dicts with the schema's column names (tests, small tools)."""
        def ragged(name: str) -> tuple[np.ndarray, np.ndarray]:
            lists = [np.asarray(r[name], dtype=np.int64) for r in rows]
            off = np.zeros(len(lists) + 1, dtype=np.int64)
            np.cumsum([len(x) for x in lists], out=off[1:])
            return (np.concatenate(lists) if lists else np.zeros(0, np.int64)), off

        ids, ids_off = ragged("input_ids")
        pos, pos_off = ragged("masked_lm_positions")
        lab, _ = ragged("masked_lm_ids")
        return cls(ids, ids_off, np.array([r["a_length"] for r in rows], np.int64), pos, pos_off, lab,
                   np.array([r["next_sentence_label"] for r in rows], np.int64))

    def take(self, idx: np.ndarray) -> "Rows":
        idx = np.asarray(idx, dtype=np.int64)
        ids, ids_off = _gather_ragged(self.ids, self.ids_off, idx)
        pos, pos_off = _gather_ragged(self.pos, self.pos_off, idx)
        lab, _ = _gather_ragged(self.lab, self.pos_off, idx)
        return Rows(ids, ids_off, self.a_length[idx], pos, pos_off, lab, self.nsp[idx])

    def slice(self, start: int, stop: int) -> "Rows":
        return self.take(np.arange(start, stop))

    @staticmethod
    def concat(parts: Sequence["Rows"]) -> "Rows":
        if len(parts) == 1:
            return parts[0]

        def offs(offsets: list[np.ndarray]) -> np.ndarray:
            out, base = [np.zeros(1, np.int64)], 0
            for o in offsets:
                out.append(o[1:] + base)
                base += o[-1]
            return np.concatenate(out)

        return Rows(np.concatenate([p.ids for p in parts]), offs([p.ids_off for p in parts]),
                    np.concatenate([p.a_length for p in parts]), np.concatenate([p.pos for p in parts]),
                    offs([p.pos_off for p in parts]), np.concatenate([p.lab for p in parts]),
                    np.concatenate([p.nsp for p in parts]))


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
    mask_id: int
    max_predictions: int
    masked_lm_prob: float = 0.15

    def __post_init__(self) -> None:
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if not 0 <= self.mask_id < self.vocab_size:
            raise ValueError(f"mask_id {self.mask_id} is outside the vocabulary (size {self.vocab_size})")

    def __call__(self, rows: Rows, rng: np.random.Generator) -> Rows:
        n, lengths = len(rows), rows.lengths
        original = rows.ids.copy()
        original[np.repeat(rows.ids_off[:-1], np.diff(rows.pos_off)) + rows.pos] = rows.lab
        row_of = np.repeat(np.arange(n), lengths)
        col = np.arange(len(original)) - rows.ids_off[:-1][row_of]
        # Candidates: every position but [CLS] (0), the [SEP] after A (a_length + 1) and the final [SEP].
        special = (col == 0) | (col == rows.a_length[row_of] + 1) | (col == lengths[row_of] - 1)
        # The reference rounds len(tokens) * prob with Python 3 rounding (half to even), as np.round does.
        k = np.minimum(self.max_predictions, np.maximum(1, np.round(lengths * self.masked_lm_prob))).astype(np.int64)
        k = np.minimum(k, np.maximum(lengths - 3, 0))  # a row never has more picks than candidates
        keys = rng.random(len(original))
        keys[special] = 2.0  # never chosen while a real candidate is left
        order = np.lexsort((keys, row_of))  # grouped by row, random order inside each row
        rank_in_row = np.arange(len(order)) - rows.ids_off[:-1][row_of[order]]
        chosen = np.sort(order[(rank_in_row < k[row_of[order]]) & ~special[order]])
        u = rng.random(len(chosen))
        ids = original.copy()
        ids[chosen[u < 0.8]] = self.mask_id
        rand = u >= 0.9
        ids[chosen[rand]] = rng.integers(0, self.vocab_size, int(rand.sum()))
        pos_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(row_of[chosen], minlength=n), out=pos_off[1:])
        return Rows(ids, rows.ids_off, rows.a_length, col[chosen], pos_off, original[chosen], rows.nsp)


# ---- the deterministic per-rank stream -----------------------------------------------------------------------------

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


@dataclass(frozen=True)
class StreamConfig:
    micro_batch_size: int
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    max_predictions: int | None = None
    pad_id: int = 0
    pad_multiple: int = 8
    length_bucketing: bool = False
    bucket_window: int = 32  # micro-batches sorted together when bucketing
    length_buckets: tuple[int, ...] | None = None  # the widths batches are padded to (None: longest, rounded)
    remasker: Remasker | None = None

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world of size {self.world_size}")
        if self.bucket_window < 1:
            raise ValueError("bucket_window must be >= 1")


class RankStream:
    """This rank's infinite sequence of collated micro-batches, starting at micro-batch `start_batch`.

    `load_shard(i)` returns shard `i` as `Rows` (the caller owns storage: local, s3, ...). Every rank must be
    built with the same `shard_rows` and seed; each reads only its own part of each epoch.
    """

    def __init__(self, shard_rows: Sequence[int], load_shard: Callable[[int], Rows], cfg: StreamConfig,
                 start_batch: int = 0) -> None:
        self.shard_rows = [int(n) for n in shard_rows]
        total = sum(self.shard_rows)
        if total < cfg.world_size:
            raise ValueError(f"the dataset has {total} rows, fewer than the {cfg.world_size} ranks reading it")
        self.cfg, self._load, self._cache = cfg, load_shard, {}
        self.rank_rows = (cfg.rank + 1) * total // cfg.world_size - cfg.rank * total // cfg.world_size
        window = cfg.bucket_window if cfg.length_bucketing else 1
        self._window_rows = window * cfg.micro_batch_size
        self._first_window, self._skip = divmod(start_batch, window)
        self.batch_index = start_batch

    def _shard(self, i: int) -> Rows:
        if i not in self._cache:
            self._cache = {i: self._load(i)}  # segments walk shards in order: one cached shard is enough
        return self._cache[i]

    def _rows_from(self, start: int) -> Iterator[Rows]:
        """The rank's rows from stream row `start` on, epoch after epoch, in pieces."""
        epoch, offset = divmod(start, self.rank_rows)
        while True:
            for s, a, b in rank_segments(self.shard_rows, self.cfg.seed, epoch, self.cfg.rank, self.cfg.world_size):
                if offset >= b - a:
                    offset -= b - a
                    continue
                yield self._shard(s).slice(a + offset, b)
                offset = 0
            epoch += 1

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for batch in micro_batches(self._rows_from(self._first_window * self._window_rows), self.cfg,
                                   self._first_window, self._skip):
            yield batch
            self.batch_index += 1


def micro_batches(pieces: Iterable[Rows], cfg: StreamConfig, first_window: int = 0, skip: int = 0,
                  ) -> Iterator[dict[str, np.ndarray]]:
    """Cut a stream of rows into collated micro-batches of exactly `cfg.micro_batch_size` rows.

    Rows are taken in windows of `bucket_window` micro-batches (1 without bucketing); with bucketing a window is
    sorted by length (random tie-break), cut, and its batches shuffled, all seeded by (seed, rank, window). The
    first `skip` batches of window `first_window` are dropped (resume); re-masking is seeded by the batch index.
    """
    m = cfg.micro_batch_size
    window_rows = (cfg.bucket_window if cfg.length_bucketing else 1) * m
    batch_index = first_window * (window_rows // m)
    for w, rows in enumerate(_windows(pieces, window_rows), start=first_window):
        batches = [np.arange(i, i + m) for i in range(0, len(rows), m)]
        if cfg.length_bucketing:
            rng = np.random.default_rng(seed_for("bucket", cfg.seed, cfg.rank, w))
            by_len = np.argsort(rows.lengths + rng.random(len(rows)), kind="stable")
            batches = [by_len[i:i + m] for i in range(0, len(rows), m)]
            batches = [batches[j] for j in rng.permutation(len(batches))]
        for j, idx in enumerate(batches):
            if w == first_window and j < skip:
                batch_index += 1
                continue
            batch_rows = rows.take(idx)
            if cfg.remasker is not None:
                rng = np.random.default_rng(seed_for("remask", cfg.seed, cfg.rank, batch_index))
                batch_rows = cfg.remasker(batch_rows, rng)
            yield collate(batch_rows, cfg.max_predictions, cfg.pad_id, cfg.pad_multiple, cfg.length_buckets)
            batch_index += 1


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


def read_shard(url: str, storage_options: dict | None = None) -> Rows:
    """One Parquet shard (local path or any fsspec URL: s3://, gs://, ...) as `Rows`."""
    import fsspec
    import pyarrow.parquet as pq

    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    with fs.open(path, "rb") as f:
        return Rows.from_arrow(pq.read_table(f, columns=list(SHARD_COLUMNS)))


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
