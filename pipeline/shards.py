"""The shards stage: exactly balanced, well-mixed shards without an all-to-all gather; each shard item makes only
its own rows.

    ShardStep   ShardItem (its own slices only) -> shards/part-i-of-S.parquet + its sidecar index
                (part-i-of-S.index.npz, corpus/shard_index.py), ShardMarker (rows, statistics, sha256s)

Every instance carries a uint64 ``key`` (a hash of seed, document, pass, index). The instances pass counts each
unit's rows per pass (and per document copy, in _work/counts); no instance is written before its shard. The
dataset's global order is fixed by the seed and the counts alone:

    for pass p in 0..D-1:  for each (unit, chunk) in a permutation seeded by (seed, p):  that chunk's rows

where chunk c of a unit's pass is its rows ``[cuts[c], cuts[c + 1])`` (``InstancesMarker.cuts``: an even split
moved to the nearest document copy boundary, so that no chunk cuts a document pass in two). Shard ``i`` of ``S``
takes global rows ``[i*N//S, (i+1)*N//S)`` (row counts differ by at most one). The driver turns the per-unit cuts
into each item's slice list (prefix sums: O(units x passes x chunks) integers, no data), so a shard item is handed
only its own slices ``(uid, pass, lo, hi)`` and makes exactly those rows: the pairs and masks of the document
copies that hold them (``instances.unit_rows``), from the unit's tokenized documents in _work. Only a shard's two
ends can cut a document pass, whose rows both shards then make (``ShardMarker.rows_made`` counts them). It orders
its rows by key within groups of at most ``ROWS_PER_GROUP`` rows (a default shard of ~128 MiB holds 4-5 groups): a
document's pairs end up spread among the rows of every other document of the group, and memory stays bounded by
the group.

``chunks_per_pass`` cuts each unit's pass into enough chunks that a shard draws on ~``CHUNKS_PER_SHARD`` of them:
a small corpus (few units per shard) gets its shards mixed from many units, a large one keeps one chunk per pass
(its shards already span hundreds of units). Because each pass is permuted independently, one document's passes
land in different places (different shards as soon as a pass spans more than one shard). See docs/data.md for what
a shard holds and how the loader's seeded shard order covers the rest.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import tempfile
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus.readers import Unit
from corpus.rng import derive_seed
from corpus.schema import instance_schema, shard_name
from corpus.shard_index import index_name, index_parquet
from pipeline.docs import vocab_info_for
from pipeline.executor import Shared, Stage
from pipeline.instances import UnitDocs, load_unit, unit_rows
from pipeline.markers import Marker, marker, write_marker
from pipeline.pool import pool_for
from pipeline.sizes import (  # noqa: F401 - where tests and tools look
    CHUNKS_PER_SHARD,
    MAX_CHUNKS,
    SHARD_BYTES,
    chunks_per_pass,
    default_num_shards,
)
from pipeline.state import BuildState
from pipeline.work import StepContext
from storage.fs import filesystem_for, join, open_atomic

# What one shard writer sorts at a time (~40 MB of seq-128 rows, ~30 pieces of units mixed): a process building two
# shards of 331k rows peaked at 804 MB with groups of 2**18, 616 MB with 2**17, 493 MB with 2**16 (the plain loop
# on the 2x shared corpora, ru_maxrss, 2026-11-25); 2**17 keeps a worker well under 1 GB with its tokenizer and pool.
ROWS_PER_GROUP = 1 << 17
# Parquet row groups of a shard: the writer encodes one at a time, so a group of sorted rows is written in pieces
# (a shard item's peak for 2**18 rows of seq 128: +519 MB written as one row group, +403 MB in row groups of 2**16;
# /proc RSS, synthetic rows, 2026-11-25). Readers read a shard whole or by row group either way.
PARQUET_ROW_GROUP = 1 << 16
UNIT_CACHE_BYTES = 128 << 20  # a shard item's units' documents kept between its slices (a unit recurs per pass)
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ShardItem:
    """The work item of one shard: shard ``index`` of ``count``, its slices ``(uid, pass, lo, hi)``, rows [lo, hi)
    of unit ``uid``'s rows in pass ``pass``, in global order, and those units (where their documents are)."""

    index: int
    """The shard's number, from 0: its place in the global order and its file name."""
    count: int
    """Shards in the dataset: the S of ``part-i-of-S``."""
    slices: tuple[tuple[str, int, int, int], ...]
    """``(uid, pass, lo, hi)``: rows [lo, hi) of unit ``uid``'s rows in pass ``pass`` (document copy order), in
    global order; only what this shard's row range covers."""
    units: tuple[Unit, ...] = ()
    """The units its slices name (each once): how the shard step reads their tokenized documents again."""

    @property
    def rows(self) -> int:
        return sum(hi - lo for _, _, lo, hi in self.slices)


def chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """Rows [a, b) of each of ``chunks`` contiguous pieces of ``n`` rows (sizes differ by at most one)."""
    return [(c * n // chunks, (c + 1) * n // chunks) for c in range(chunks)]


def unit_order(num_pieces: int, seed: int, pass_idx: int) -> np.ndarray:
    """The order of the (unit, chunk) pieces in pass ``pass_idx``: a permutation seeded by (seed, pass)."""
    return np.random.default_rng(derive_seed(seed, "unit-order", pass_idx)).permutation(num_pieces)


def even_cuts(rows: int, chunks: int) -> tuple[int, ...]:
    """``chunk_bounds`` as cuts: 0, the end of each chunk."""
    return (0,) + tuple(b for _, b in chunk_bounds(rows, chunks))


def plan_shards(unit_cuts: Sequence[tuple[str, Sequence[Sequence[int]]]], num_shards: int, seed: int
                ) -> list[ShardItem]:
    """Shard i gets global rows [i*N//S, (i+1)*N//S); ``unit_cuts``: (uid, per pass the cuts of its rows into
    chunks: 0, ..., rows) in unit order, every unit and pass with the same number of chunks."""
    uids = [u for u, _ in unit_cuts]
    cuts = [[list(c) for c in per_pass] for _, per_pass in unit_cuts]
    passes = len(cuts[0]) if cuts else 0
    chunks = len(cuts[0][0]) - 1 if cuts else 1
    segs: list[tuple[int, int, int, int]] = []  # (unit, pass, first row, rows)
    for p in range(passes):
        for k in unit_order(len(uids) * chunks, seed, p).tolist():
            u, c = divmod(k, chunks)
            a, b = cuts[u][p][c], cuts[u][p][c + 1]
            segs.append((u, p, a, b - a))
    starts = np.zeros(len(segs) + 1, np.int64)
    np.cumsum([n for *_, n in segs], out=starts[1:])
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
                u, p, a, _ = segs[k]
                slices.append((uids[u], p, a + max(lo, s) - s, a + min(hi, e) - s))
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


@dataclasses.dataclass
class ShardStats:
    """What a shard's rows hold, for the manifest: added up over the shards."""

    rows: int = 0
    """Rows written."""
    random_next: int = 0
    """Rows whose segment B is a random document's."""
    masked: int = 0
    """Masked LM positions over the rows."""
    seq_len: Counter = dataclasses.field(default_factory=Counter)
    """Rows by sequence length in tokens."""
    masked_per_seq: Counter = dataclasses.field(default_factory=Counter)
    """Rows by their number of masked positions."""
    lengths: list = dataclasses.field(default_factory=list)
    """Each group's row lengths (``len(input_ids)``), in file order: the sidecar index's ``lengths``."""

    def add(self, part: pa.Table) -> None:
        self.rows += part.num_rows
        if not part.num_rows:
            return
        lengths = np.diff(part.column("input_ids").combine_chunks().offsets.to_numpy())
        per_seq = np.diff(part.column("masked_lm_positions").combine_chunks().offsets.to_numpy())
        self.lengths.append(lengths)
        self.seq_len.update({k: v for k, v in enumerate(np.bincount(lengths).tolist()) if v})
        self.masked_per_seq.update({k: v for k, v in enumerate(np.bincount(per_seq).tolist()) if v})
        self.random_next += int(pc.sum(part.column("next_sentence_label")).as_py())
        self.masked += int(per_seq.sum())


def write_shard(item: ShardItem, where, source: Callable[[tuple[str, int, int, int]], pa.Table],
                schema: pa.Schema, rows_per_group: int = ROWS_PER_GROUP) -> ShardStats:
    """Write one shard's Parquet to ``where`` (a local path or an open local file) from its slices
    (``source(slice)``: the slice's rows, with their ``key``), each group of slices in key order; returns what its
    rows hold."""
    stats = ShardStats()
    with pq.ParquetWriter(where, schema, compression="zstd") as w:
        for group in _groups(item.slices, rows_per_group):
            table = pa.concat_tables([source(s) for s in group])
            # Stable: equal keys (a 64-bit collision) keep the global order, which is fixed.
            order = np.argsort(table.column("key").to_numpy(), kind="stable")
            part = table.take(pa.array(order)).select(schema.names).cast(schema)
            del table
            w.write_table(part, row_group_size=PARQUET_ROW_GROUP)
            stats.add(part)
            del part
        if stats.rows == 0:
            w.write_table(schema.empty_table())
    return stats


@marker("shards")
class ShardMarker(Marker):
    index: int
    """The shard's number, from 0: the marker's key."""
    file: str
    """The shard's path under the output folder, ``shards/part-i-of-S.parquet`` (``corpus.schema.shard_name``)."""
    rows: int
    """Instance rows written: the shards' counts differ by at most one."""
    random_next: int = 0
    """Rows whose segment B is a random document's (``next_sentence_label`` 1)."""
    masked: int = 0
    """Masked LM positions over the shard's rows."""
    seq_len_histogram: dict[str, int] = dataclasses.field(default_factory=dict)
    """Rows by sequence length in tokens ([CLS] and [SEP] included), keyed by the length as str (JSON keys)."""
    masked_per_seq_histogram: dict[str, int] = dataclasses.field(default_factory=dict)
    """Rows by their number of masked positions, keyed by that number as str (JSON keys)."""
    sha256: str = ""
    """sha256 hex of the whole shard file as written (the manifest's ``sha256``)."""
    bytes: int = 0
    """The shard file's size."""
    index_sha256: str = ""
    """sha256 hex of the sidecar index's bytes (``corpus/shard_index.py``), written beside the shard."""
    rows_made: int = 0
    """Rows the item made to write ``rows``: more by the rows of the document copies its slices cut (made again by
    the shard on the other side of the cut); what not writing instances to _work costs (docs/architecture.md)."""


@dataclasses.dataclass(frozen=True)
class ShardStep:
    """One shard: its rows made from its units' documents (``instances.unit_rows``), written, indexed, committed."""

    ctx: StepContext
    """Where the units' documents and counts are (_work), where the shards go (the output), the instance settings."""
    vocab: Shared
    """The vocabulary's tokens (special ids, ## pieces, the ids random replacements are drawn from)."""
    pool: Shared
    """The merged random-next pool's table, built into a ``RandomDocPool`` once per process (``pool_for``)."""
    dropped: frozenset[str] = frozenset()
    """The docs files with a drop list (drops.py): their listed documents are left out, as the instances pass did."""
    copied: frozenset[str] = frozenset()
    """The docs files with a copies list (--mix weights above 1): their documents' copies, as the instances pass."""

    def setup(self) -> None:
        vocab_info_for(self.vocab)
        pool_for(self.pool)

    def __call__(self, item: ShardItem) -> ShardMarker:
        ctx = self.ctx
        name = shard_name(item.index, item.count)
        units = {u.uid: u for u in item.units}
        pool, vocab = pool_for(self.pool), vocab_info_for(self.vocab)
        cache: OrderedDict[str, UnitDocs] = OrderedDict()
        rows_made = [0]

        def source(s: tuple[str, int, int, int]) -> pa.Table:
            uid, p, lo, hi = s
            u = cache.pop(uid, None) or load_unit(units[uid], ctx, self.dropped, self.copied)
            cache[uid] = u
            while sum(x.nbytes for x in cache.values()) > UNIT_CACHE_BYTES and len(cache) > 1:
                cache.popitem(last=False)
            rows, made = unit_rows(u, p, lo, hi, ctx, pool, vocab)
            rows_made[0] += made
            return rows

        url = join(ctx.output, name)
        schema = instance_schema(ctx.vocab_size)
        fs, _ = filesystem_for(url, ctx.endpoint_url)
        protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
        if "file" in protocols:  # written in place under its temporary name, indexed there, then renamed
            # open_atomic proves the output's fence fresh right before the rename: a writer that lost the output
            # (a stall past the lease) never lands a shard.
            with open_atomic(url, ctx.endpoint_url, fence=ctx.fence) as f:
                stats = write_shard(item, f, source, schema, ROWS_PER_GROUP)
                f.flush()
                index, data = self._index(item, stats, f.name, name)
        else:  # an object store: written and indexed locally, then uploaded (visible once complete)
            with tempfile.TemporaryDirectory(prefix="shard-") as tmp:
                local = os.path.join(tmp, os.path.basename(name))
                stats = write_shard(item, local, source, schema, ROWS_PER_GROUP)
                index, data = self._index(item, stats, local, name)
                with open_atomic(url, ctx.endpoint_url, fence=ctx.fence) as f, open(local, "rb") as src:
                    while block := src.read(8 << 20):
                        f.write(block)
        marker = ShardMarker(
            index=item.index, file=name, rows=stats.rows, random_next=stats.random_next, masked=stats.masked,
            seq_len_histogram={str(k): int(v) for k, v in sorted(stats.seq_len.items())},
            masked_per_seq_histogram={str(k): int(v) for k, v in sorted(stats.masked_per_seq.items())},
            sha256=index.file_sha256, bytes=index.file_bytes, index_sha256=hashlib.sha256(data).hexdigest(),
            rows_made=rows_made[0])
        write_marker(ctx.work, marker, ctx.endpoint_url, ctx.fence)
        return marker

    def _index(self, item: ShardItem, stats: ShardStats, local: str, name: str):
        """The finished local shard's sidecar index, committed beside where the shard goes (before it)."""
        assert stats.rows == item.rows, (stats.rows, item.rows)
        index = index_parquet(local, np.concatenate(stats.lengths) if stats.lengths else np.zeros(0, np.int64))
        data = index.to_bytes()
        with open_atomic(join(self.ctx.output, index_name(name)), self.ctx.endpoint_url, fence=self.ctx.fence) as f:
            f.write(data)  # proved like the shard: a writer that lost the output never replaces the new one's index
        return index, data


def shards_stage(s: BuildState) -> Stage:
    inst: list = s.markers["instances"]  # InstancesMarker, in unit order
    assert s.pool is not None, "the shards run after the pool's merge"
    items = plan_shards([(m.uid, m.cuts) for m in inst], s.num_shards, s.cfg.instances.seed)
    items = [dataclasses.replace(t, units=tuple(s.doc_units[uid] for uid in dict.fromkeys(u for u, *_ in t.slices)))
             for t in items]
    step = ShardStep(s.ctx, s.vocab, s.pool, s.dropped, s.copied)
    return Stage("shards", step, {f"{t.index:05d}": t for t in items}, ShardMarker, noun="shards", after=_made)


def _made(s: BuildState) -> BuildState:
    """Say what making each shard's rows where it is written cost: rows made per row written."""
    markers: list = s.markers["shards"]
    rows, made = sum(m.rows for m in markers), sum(m.rows_made for m in markers)
    log.info("shards: %d rows made for %d written (%.4fx: document passes cut by a shard's boundary are made on "
             "both sides)", made, rows, made / max(1, rows))
    return s
