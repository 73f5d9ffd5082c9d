"""The shards stage: exactly balanced, well-mixed shards without an all-to-all gather; each shard item reads only
its own slices.

    ShardStep   ShardItem (its own slices only) -> shards/part-i-of-S.parquet, ShardMarker

Every instance carries a uint64 ``key`` (a hash of seed, document, pass, index). Each instances item writes its
unit's rows pass by pass, each pass cut into ``chunks`` contiguous record batches. The dataset's global order is
fixed by the seed and the plan alone:

    for pass p in 0..D-1:  for each (unit, chunk) in a permutation seeded by (seed, p):  that chunk's rows

Shard ``i`` of ``S`` takes global rows ``[i*N//S, (i+1)*N//S)`` (row counts differ by at most one). The driver turns
the per-unit row counts into each item's slice list (prefix sums: O(units x passes x chunks) integers, no data),
so a shard item opens only the chunks its range covers and is handed only its own slices. It orders its rows by
key within groups of at most ``ROWS_PER_GROUP`` rows (a default shard of ~128 MiB holds 4-5 groups): a document's
pairs end up spread among the rows of every other document of the group, and memory stays bounded by the group.

``chunks_per_pass`` cuts each unit's pass into enough chunks that a shard draws on ~``CHUNKS_PER_SHARD`` of them:
a small corpus (few units per shard) gets its shards mixed from many units, a large one keeps one chunk per pass
(its shards already span hundreds of units) and the fewest reads. Because each pass is permuted independently,
one document's passes land in different places (different shards as soon as a pass spans more than one shard).
See docs/data.md for what a shard holds and how the loader's seeded shard order covers the rest.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpus.rng import derive_seed
from corpus.schema import instance_schema, shard_name
from pipeline.executor import Stage
from pipeline.markers import Marker, marker, write_marker
from pipeline.sizes import SHARD_BYTES, default_num_shards  # noqa: F401 - where tests and tools look
from pipeline.state import BuildState
from pipeline.work import WORK_SUFFIX, StepContext
from storage.fs import filesystem_for, join, open_atomic

# What one shard writer sorts at a time (~40 MB of seq-128 rows, ~30 pieces of units mixed): a process building two
# shards of 331k rows peaked at 804 MB with groups of 2**18, 616 MB with 2**17, 493 MB with 2**16 (the plain loop
# on the 2x shared corpora, ru_maxrss, 2026-11-25); 2**17 keeps a worker well under 1 GB with its tokenizer and pool.
ROWS_PER_GROUP = 1 << 17
# Parquet row groups of a shard: the writer encodes one at a time, so a group of sorted rows is written in pieces
# (a shard item's peak for 2**18 rows of seq 128: +519 MB written as one row group, +403 MB in row groups of 2**16;
# /proc RSS, synthetic rows, 2026-11-25). Readers read a shard whole or by row group either way.
PARQUET_ROW_GROUP = 1 << 16
CHUNKS_PER_SHARD = 32  # pieces of units a shard should mix, when the corpus has fewer units than that per shard
MAX_CHUNKS = 64  # chunks per unit and pass at most: each is one small read for a shard item
_READ_THREADS = 8


@dataclasses.dataclass(frozen=True)
class ShardItem:
    """The work item of one shard: shard ``index`` of ``count``, its slices ``(uid, batch, lo, hi)``, rows [lo, hi)
    of record batch ``batch`` of the unit's instances file, in global order."""

    index: int
    """The shard's number, from 0: its place in the global order and its file name."""
    count: int
    """Shards in the dataset: the S of ``part-i-of-S``."""
    slices: tuple[tuple[str, int, int, int], ...]
    """``(uid, batch, lo, hi)``: rows [lo, hi) of record batch ``batch`` of unit ``uid``'s instances file, in global
    order; only what this shard's row range covers."""

    @property
    def rows(self) -> int:
        return sum(hi - lo for _, _, lo, hi in self.slices)


def chunks_per_pass(num_units: int, dupe_factor: int, num_shards: int) -> int:
    """Record batches per unit and pass, so that a shard spans ~CHUNKS_PER_SHARD pieces (1 for a large corpus)."""
    need = -(-CHUNKS_PER_SHARD * num_shards // max(1, num_units * dupe_factor))  # ceil
    return max(1, min(MAX_CHUNKS, need))


def chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """Rows [a, b) of each of ``chunks`` contiguous pieces of ``n`` rows (sizes differ by at most one)."""
    return [(c * n // chunks, (c + 1) * n // chunks) for c in range(chunks)]


def unit_order(num_pieces: int, seed: int, pass_idx: int) -> np.ndarray:
    """The order of the (unit, chunk) pieces in pass ``pass_idx``: a permutation seeded by (seed, pass)."""
    return np.random.default_rng(derive_seed(seed, "unit-order", pass_idx)).permutation(num_pieces)


def plan_shards(unit_rows: Sequence[tuple[str, Sequence[int]]], num_shards: int, seed: int,
                chunks: int = 1) -> list[ShardItem]:
    """Shard i gets global rows [i*N//S, (i+1)*N//S); ``unit_rows``: (uid, rows per pass) in unit order, each
    pass of each unit written as ``chunks`` record batches (``chunk_bounds``)."""
    uids = [u for u, _ in unit_rows]
    counts = np.array([list(r) for _, r in unit_rows], dtype=np.int64).reshape(len(uids), -1)
    segs: list[tuple[int, int, int]] = []  # (unit, batch, rows)
    for p in range(counts.shape[1]):
        for k in unit_order(len(uids) * chunks, seed, p).tolist():
            u, c = divmod(k, chunks)
            a, b = chunk_bounds(int(counts[u, p]), chunks)[c]
            segs.append((u, p * chunks + c, b - a))
    starts = np.zeros(len(segs) + 1, np.int64)
    np.cumsum([n for _, _, n in segs], out=starts[1:])
    total = int(starts[-1])
    items = []
    for i in range(num_shards):
        lo, hi = i * total // num_shards, (i + 1) * total // num_shards
        slices = []
        first = int(np.searchsorted(starts, lo, side="right")) - 1
        for k in range(max(first, 0), len(segs)):
            s, e = int(starts[k]), int(starts[k + 1])
            if s >= hi:
                break
            if e > lo and e > s:
                u, batch, _ = segs[k]
                slices.append((uids[u], batch, max(lo, s) - s, min(hi, e) - s))
        items.append(ShardItem(i, num_shards, tuple(slices)))
    return items


def _groups(slices: Sequence[tuple[str, int, int, int]], limit: int) -> list[list[tuple[str, int, int, int]]]:
    """Consecutive slices in groups of at most ``limit`` rows (a bigger slice forms a group of its own)."""
    groups: list[list] = [[]]
    rows = 0
    for s in slices:
        n = s[3] - s[2]
        if groups[-1] and rows + n > limit:
            groups.append([])
            rows = 0
        groups[-1].append(s)
        rows += n
    return [g for g in groups if g]


def _read_slice(url: str, batch: int, lo: int, hi: int, endpoint_url: str | None) -> pa.RecordBatch:
    fs, path = filesystem_for(url, endpoint_url)
    with fs.open(path, "rb") as fh:
        return pa.ipc.open_file(fh).get_batch(batch).slice(lo, hi - lo)


def write_shard(item: ShardItem, url: str, source: Callable[[str], str], schema: pa.Schema,
                endpoint_url: str | None = None, rows_per_group: int = ROWS_PER_GROUP) -> int:
    """Write one shard atomically from its slices (``source(uid)``: a unit's instances file); returns its rows."""
    rows = 0
    with open_atomic(url, endpoint_url) as f:
        with pq.ParquetWriter(f, schema, compression="zstd") as w:
            for group in _groups(item.slices, rows_per_group):
                # Slices are small reads from different files: concurrent on object storage, in a fixed order.
                with concurrent.futures.ThreadPoolExecutor(min(_READ_THREADS, len(group))) as threads:
                    table = pa.Table.from_batches(list(threads.map(
                        lambda s: _read_slice(source(s[0]), s[1], s[2], s[3], endpoint_url), group)))
                # Stable: equal keys (a 64-bit collision) keep the global order, which is fixed.
                order = np.argsort(table.column("key").to_numpy(), kind="stable")
                part = table.take(pa.array(order)).select(schema.names).cast(schema)
                w.write_table(part, row_group_size=PARQUET_ROW_GROUP)
                rows += part.num_rows
                del table, part
            if rows == 0:
                w.write_table(schema.empty_table())
    return rows


@marker("shards")
class ShardMarker(Marker):
    index: int
    """The shard's number, from 0: the marker's key."""
    file: str
    """The shard's path under the output folder, ``shards/part-i-of-S.parquet`` (``corpus.schema.shard_name``)."""
    rows: int
    """Instance rows written: the shards' counts differ by at most one."""


@dataclasses.dataclass(frozen=True)
class ShardStep:
    ctx: StepContext
    """Where the units' instances files are (_work), where the shards go (the output) and the vocabulary's size."""

    def __call__(self, item: ShardItem) -> ShardMarker:
        ctx = self.ctx
        name = shard_name(item.index, item.count)
        rows = write_shard(item, join(ctx.output, name), lambda uid: ctx.url("instances", uid + WORK_SUFFIX),
                           instance_schema(ctx.vocab_size), ctx.endpoint_url)
        assert rows == item.rows, (rows, item.rows)
        marker = ShardMarker(index=item.index, file=name, rows=rows)
        write_marker(ctx.work, marker, ctx.endpoint_url, ctx.fence)
        return marker


def shards_stage(s: BuildState) -> Stage:
    inst: list = s.markers["instances"]  # InstancesMarker, in unit order
    (chunks,) = {m.chunks for m in inst}  # the same plan for every unit, resumed or not
    items = plan_shards([(m.uid, m.rows) for m in inst], s.num_shards, s.cfg.instances.seed, chunks)
    return Stage("shards", ShardStep(s.ctx), {f"{t.index:05d}": t for t in items}, ShardMarker, noun="shards")
