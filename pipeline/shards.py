"""Exactly balanced, shuffled shards from hash-keyed instances, with memory bounded by one bucket.

Every instance carries a uint64 ``key`` (a hash of seed, document, pass, index). The global order of the dataset is
the order of the keys, which is a seeded shuffle that no worker layout can change. To sort without holding the
corpus, each work unit writes its instances grouped by *bucket* = the top ``bits`` of the key (one row group per
bucket), so that ordering by (bucket, key) is ordering by key, whatever ``bits`` is. After counting rows per bucket,
shard ``i`` of ``S`` takes global rows ``[i*N//S, (i+1)*N//S)``: row counts differ by at most one. A shard writer
reads only the buckets it overlaps, one at a time, sorts each by key and writes its slice.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.storage import filesystem_for, open_atomic

ROWS_PER_BUCKET = 1 << 18  # ~100 MB of seq-128 rows: what one shard writer holds at a time


def bucket_bits(expected_rows: int, num_shards: int = 1) -> int:
    """Key bits that name a bucket: buckets of at most ~ROWS_PER_BUCKET rows, and at least two buckets per shard so
    that a shard writer reads ~2 buckets' worth, not the whole dataset (0 bits = one bucket)."""
    by_rows = math.ceil(math.log2(max(1, expected_rows) / ROWS_PER_BUCKET)) if expected_rows else 0
    by_shards = math.ceil(math.log2(2 * num_shards)) if num_shards > 1 else 0
    return max(0, min(16, max(by_rows, by_shards)))


def buckets_of(keys: np.ndarray, bits: int) -> np.ndarray:
    if bits == 0:
        return np.zeros(len(keys), dtype=np.int64)
    return (keys >> np.uint64(64 - bits)).astype(np.int64)


# Intermediate (_work) files are written once and read once, then deleted: Arrow IPC files (no encoding, no
# compression; a record batch is read back by index, like a Parquet row group). Final shards are zstd Parquet.
WORK_SUFFIX = ".arrow"


def write_work_table(f, table: pa.Table) -> None:
    """One record batch: ``read_work_table`` gives the table back."""
    with pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table.combine_chunks())


def read_work_table(f) -> pa.Table:
    return pa.ipc.open_file(f).read_all()


def write_bucketed(url: str, table: pa.Table, bits: int, endpoint_url: str | None = None) -> list[list[int]]:
    """Write ``table`` (with a uint64 ``key`` column) as one record batch per non-empty bucket, atomically.

    Returns ``[[bucket, batch, rows], ...]`` for the unit's marker.
    """
    keys = table.column("key").to_numpy()
    buckets = buckets_of(keys, bits)
    order = np.argsort(buckets, kind="stable")
    table = table.take(pa.array(order)).combine_chunks()
    sorted_b = buckets[order]
    index: list[list[int]] = []
    with open_atomic(url, endpoint_url) as f:
        with pa.ipc.new_file(f, table.schema) as w:
            starts = np.flatnonzero(np.r_[True, sorted_b[1:] != sorted_b[:-1]]) if len(sorted_b) else []
            bounds = list(starts) + [len(sorted_b)]
            for batch, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
                w.write_batch(table.slice(a, b - a).to_batches()[0])
                index.append([int(sorted_b[a]), batch, int(b - a)])
    return index


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """Shard ``index`` of ``count``: for each bucket it overlaps, the slice [lo, hi) of that key-sorted bucket."""

    index: int
    count: int
    slices: tuple[tuple[int, int, int], ...]  # (bucket, lo, hi)

    @property
    def rows(self) -> int:
        return sum(hi - lo for _, lo, hi in self.slices)


def plan_shards(bucket_rows: dict[int, int], num_shards: int) -> list[ShardTask]:
    """Exact balance: shard i gets global rows [i*N//S, (i+1)*N//S) of the (bucket, key) order."""
    buckets = sorted(b for b, n in bucket_rows.items() if n)
    starts, pos = [], 0
    for b in buckets:
        starts.append(pos)
        pos += bucket_rows[b]
    total = pos
    tasks = []
    for i in range(num_shards):
        lo, hi = i * total // num_shards, (i + 1) * total // num_shards
        slices = []
        for b, s in zip(buckets, starts):
            e = s + bucket_rows[b]
            if e > lo and s < hi:
                slices.append((b, max(lo, s) - s, min(hi, e) - s))
        tasks.append(ShardTask(i, num_shards, tuple(slices)))
    return tasks


def read_bucket(sources: Iterable[tuple[str, list[int]]], endpoint_url: str | None = None) -> pa.Table | None:
    """Concatenate record batches ``[(url, [batch, ...]), ...]`` (in the given, deterministic order)."""
    batches = []
    for url, groups in sources:
        fs, path = filesystem_for(url, endpoint_url)
        with fs.open(path, "rb") as fh:
            reader = pa.ipc.open_file(fh)
            batches += [reader.get_batch(g) for g in groups]
    return pa.Table.from_batches(batches) if batches else None


def write_shard(task: ShardTask, url: str, sources: dict[int, list[tuple[str, list[int]]]], schema: pa.Schema,
                endpoint_url: str | None = None) -> int:
    """Write one shard atomically from its bucket slices; returns its row count."""
    rows = 0
    with open_atomic(url, endpoint_url) as f:
        with pq.ParquetWriter(f, schema, compression="zstd") as w:
            for bucket, lo, hi in task.slices:
                table = read_bucket(sources.get(bucket, []), endpoint_url)
                assert table is not None and table.num_rows >= hi, (bucket, hi)
                # Stable sort: equal keys (a 64-bit collision) keep the unit order, which is fixed.
                order = np.argsort(table.column("key").to_numpy(), kind="stable")[lo:hi]
                part = table.take(pa.array(order)).select(schema.names).cast(schema)
                w.write_table(part)
                rows += part.num_rows
                del table
            if rows == 0:
                w.write_table(schema.empty_table())
    return rows
