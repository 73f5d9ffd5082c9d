"""One worker's reads of a dataset with sidecar indexes (corpus/shard_index.py): the lengths for the order, then
only the footer and the row groups that hold the worker's own rows, each span checked against its sha256 before
it is decoded.

    reader = ShardReader(manifest, endpoint_url, masked_rule)
    reader.planned(i)        shard i's rows as `pretraining.order.Planned`: ids, lengths and masked counts (index)
    reader.fetch(part)       the rows a `Planned` part names, read and decoded (`Rows`, example ids and epochs set)
    reader.prefetch(part)    start reading the row groups `part` needs in background threads (bounded)

What is read, per shard: its index (verified against the manifest's `index_sha256`; its file digest, size and rows
against the manifest's), its footer (verified, once), and each row group that holds a requested row (verified, once
while it is cached: `cache_groups` decoded row groups are kept, the stream moves through a shard in file order).
A span whose bytes differ from the build's digest is refused with one line naming the shard: a shard replaced
after the build is never decoded. Reads outside the fetched spans are refused too (`_Spans`), so the decoder
cannot read unverified bytes.

`stats` counts requests and bytes (index, footer, row groups) for benchmarks and tests.
"""
from __future__ import annotations

import concurrent.futures
import io
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from corpus.schema import SHARD_COLUMNS, Manifest
from corpus.shard_index import ShardIndex, verify_span
from pretraining.order import Planned, split_example
from pretraining.rows import Rows
from storage.fs import filesystem_for
from storage.untrusted import read_bounded

MAX_INDEX_BYTES = 1 << 30  # 2 bytes per row plus 100 per row group: far above any shard's
KEEP_SHARDS = 64  # indexes and footers kept: a window (packed: up to 3 x 32 x B rows) spans fewer shards


@dataclass
class ReadStats:
    """What a reader fetched from storage."""

    requests: int = 0
    """Range or whole-object reads issued."""
    bytes: int = 0
    """Bytes received: indexes, footers and row groups."""
    index_bytes: int = 0
    """Of which sidecar indexes (the lengths the order needs)."""
    groups: int = 0
    """Row groups fetched."""
    prefetched: int = 0
    """Row groups whose read a `prefetch` started before they were needed."""
    on_demand: int = 0
    """Row groups whose read started only when they were needed (the consumer waited for the store)."""
    shard_bytes: int = 0
    """The bytes of the shards whose index was read (planned): what reading those shards whole would read."""


class _Spans(io.RawIOBase):
    """A read-only file of `size` bytes of which only `spans` ({offset: bytes}) are present: pyarrow reads the
    footer and row groups from it; a read of any other byte is refused (the decoder sees only verified bytes)."""

    def __init__(self, size: int, spans: dict[int, bytes], where: str) -> None:
        self._size, self._spans, self._where, self._pos = size, sorted(spans.items()), where, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if whence == 0 else self._pos + offset if whence == 1 else self._size + offset
        return self._pos

    def read(self, n: int = -1) -> bytes:
        n = self._size - self._pos if n is None or n < 0 else min(n, self._size - self._pos)
        for start, data in self._spans:
            if start <= self._pos and self._pos + n <= start + len(data):
                out = data[self._pos - start:self._pos - start + n]
                self._pos += n
                return out
        raise ValueError(f"{self._where}: the decoder asked for bytes {self._pos}..{self._pos + n} outside the "
                         "spans the index vouches for: the shard is not the one the build wrote; rebuild it")

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


class ShardReader:
    """One worker's reader of a dataset's indexed shards (see the module docstring). `masked_rule(lengths)` gives
    each row's masked positions (what the order's totals and packing need); thread-safe."""

    def __init__(self, manifest: Manifest, endpoint_url: str | None,
                 masked_rule: Callable[[np.ndarray], np.ndarray], window_rows: int = 8192, threads: int = 4) -> None:
        self.manifest, self.endpoint_url, self.masked_rule = manifest, endpoint_url, masked_rule
        self.stats = ReadStats()
        self._lock = threading.Lock()
        self._indexes: OrderedDict[int, ShardIndex] = OrderedDict()
        self._planned: set[int] = set()
        self._wanted: Counter[tuple[int, int]] = Counter()  # row groups of parts prefetched, not yet released
        self._footers: OrderedDict[int, bytes] = OrderedDict()
        self._meta: OrderedDict[int, object] = OrderedDict()  # parsed footers
        self._footer_reads: dict[int, concurrent.futures.Future] = {}  # footers being read
        self._tables: OrderedDict[tuple[int, int], object] = OrderedDict()  # decoded row groups (pyarrow Tables)
        self._pending: OrderedDict[tuple[int, int], concurrent.futures.Future] = OrderedDict()  # raw spans
        # Memory: decoded row groups of at most two windows of rows plus one row group (the current window and the
        # next one, read ahead); raw spans read ahead of at most two windows of rows plus one row group.
        self._cache_rows, self._ahead_rows = 2 * window_rows, 2 * window_rows
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="shard-read")

    @staticmethod
    def indexed(manifest: Manifest) -> bool:
        """Whether every shard of `manifest` has an index (a dataset built before has none)."""
        return all(s.index_url and s.sha256 for s in manifest.shards)

    # ---- storage ----------------------------------------------------------------------------------------------

    def _range(self, url: str, offset: int, size: int) -> bytes:
        fs, path = filesystem_for(url, self.endpoint_url)
        data = fs.cat_file(path, start=offset, end=offset + size)
        with self._lock:
            self.stats.requests += 1
            self.stats.bytes += len(data)
        if len(data) != size:
            raise ValueError(f"{url}: {len(data)} bytes at {offset}, the index says {size}: the shard is not the "
                             "one the build wrote; rebuild the dataset")
        return data

    def index(self, i: int) -> ShardIndex:
        with self._lock:
            if i in self._indexes:
                self._indexes.move_to_end(i)
                return self._indexes[i]
        shard = self.manifest.shards[i]
        data = read_bounded(shard.index_url, MAX_INDEX_BYTES, self.endpoint_url, "shard index")
        with self._lock:
            self.stats.requests += 1
            self.stats.bytes += len(data)
            self.stats.index_bytes += len(data)
        index = ShardIndex.from_bytes(data, shard.index_sha256, shard.index_url)
        if (index.file_sha256, index.file_bytes, index.rows) != (shard.sha256, shard.bytes, shard.rows):
            raise ValueError(f"{shard.index_url}: describes a shard of {index.rows} rows and {index.file_bytes} "
                             f"bytes, the manifest's {shard.url} has {shard.rows} and {shard.bytes} (or another "
                             "digest): the dataset was changed after its build; rebuild it")
        with self._lock:
            if i not in self._planned:
                self._planned.add(i)
                self.stats.shard_bytes += shard.bytes
            self._indexes[i] = index
            while len(self._indexes) > KEEP_SHARDS:
                self._indexes.popitem(last=False)
        return index

    def _footer(self, i: int, index: ShardIndex) -> bytes:
        """Shard i's footer, read and verified once (a second caller waits for the first's read)."""
        with self._lock:
            if i in self._footers:
                return self._footers[i]
            future, owner = self._footer_reads.get(i), False
            if future is None:
                future, owner = concurrent.futures.Future(), True
                self._footer_reads[i] = future
        if not owner:
            return future.result()
        url = self.manifest.shards[i].url
        try:
            data = self._range(url, *index.footer_span)
            verify_span(data, index.footer_sha256, f"{url} (its footer)")
        except BaseException as e:
            future.set_exception(e)
            raise
        finally:
            with self._lock:
                self._footer_reads.pop(i, None)
        with self._lock:
            self._footers[i] = data
            while len(self._footers) > KEEP_SHARDS:
                self._footers.popitem(last=False)
        future.set_result(data)
        return data

    def _metadata(self, i: int, footer: bytes):
        """The Parquet metadata in a verified footer (parsed once per shard while cached)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        with self._lock:
            meta = self._meta.get(i)
        if meta is None:
            meta = pq.read_metadata(pa.BufferReader(b"PAR1" + footer))
            with self._lock:
                self._meta[i] = meta
                while len(self._meta) > KEEP_SHARDS:
                    self._meta.popitem(last=False)
        return meta

    def _raw_group(self, i: int, g: int) -> bytes:
        index = self.index(i)
        url = self.manifest.shards[i].url
        offset, size = (int(x) for x in index.group_spans[g])
        data = self._range(url, offset, size)
        verify_span(data, index.group_sha256[g], f"{url} (row group {g})")
        with self._lock:
            self.stats.groups += 1
        return data

    def _table(self, i: int, g: int):
        import pyarrow as pa
        import pyarrow.parquet as pq

        key = (i, g)
        with self._lock:
            if key in self._tables:
                self._tables.move_to_end(key)
                return self._tables[key]
            future = self._pending.pop(key, None)
            if future is None:
                self.stats.on_demand += 1
        index = self.index(i)
        raw = future.result() if future is not None else self._raw_group(i, g)
        footer = self._footer(i, index)
        url = self.manifest.shards[i].url
        spans = {int(index.group_spans[g][0]): raw, index.footer_span[0]: footer}
        with pa.PythonFile(_Spans(index.file_bytes, spans, url), mode="r") as f:
            table = pq.ParquetFile(f, metadata=self._metadata(i, footer)).read_row_group(g, columns=list(SHARD_COLUMNS))
        if table.num_rows != int(index.group_rows[g]):
            raise ValueError(f"{url}: row group {g} holds {table.num_rows} rows, the index says "
                             f"{int(index.group_rows[g])}; rebuild the dataset")
        with self._lock:
            self._tables[key] = table
            held = sum(t.num_rows for t in self._tables.values()) - table.num_rows
            for old in [k for k in self._tables if k != key and not self._wanted.get(k)]:  # oldest first
                if held <= self._cache_rows:
                    break
                held -= self._tables.pop(old).num_rows
        return table

    # ---- what the order and the loader call -------------------------------------------------------------------

    def planned(self, i: int) -> Planned:
        """Shard i's rows as the order needs them (its index's lengths and `masked_rule`'s counts)."""
        lengths = self.index(i).lengths.astype(np.int64)
        return Planned(lengths, self.masked_rule(lengths))

    def _groups_of(self, part: Planned) -> list[tuple[int, int]]:
        shard, row = split_example(part.example)
        keys: list[tuple[int, int]] = []
        for s in np.unique(shard):
            starts = self.index(int(s)).group_starts()
            groups = np.unique(np.searchsorted(starts, row[shard == s], side="right") - 1)
            keys.extend((int(s), int(g)) for g in groups)
        return keys

    def prefetch(self, part: Planned) -> list[tuple[int, int]]:
        """Start reading the row groups `part`'s rows are in, and their shards' footers (raw spans of at most two
        windows of rows plus one row group held ahead: past that, a group is read when needed). Their decoded
        groups are kept until `release` of the keys it returns."""
        if not len(part):
            return []
        keys = self._groups_of(part)
        with self._lock:
            self._wanted.update(keys)
        for key in keys:
            rows = int(self.index(key[0]).group_rows[key[1]])
            with self._lock:
                if key in self._tables or key in self._pending:
                    continue
                ahead = sum(int(self._indexes[k[0]].group_rows[k[1]]) for k in self._pending if k[0] in self._indexes)
                if self._pending and ahead + rows > self._ahead_rows:
                    continue
                self._pending[key] = self._pool.submit(self._raw_group, *key)
                self.stats.prefetched += 1
                footer = key[0] not in self._footers and key[0] not in self._footer_reads
            if footer:
                self._pool.submit(self._footer, key[0], self.index(key[0]))
        return keys

    def release(self, keys: list[tuple[int, int]]) -> None:
        """The row groups a `prefetch` named are no longer needed for its part (they may be evicted)."""
        with self._lock:
            self._wanted.subtract(keys)
            for key in keys:
                if self._wanted[key] <= 0:
                    del self._wanted[key]

    def rows(self, i: int, wanted: np.ndarray) -> Rows:
        """Rows `wanted` (sorted, unique) of shard i, decoded from the row groups that hold them only."""
        starts = self.index(i).group_starts()
        groups = np.searchsorted(starts, wanted, side="right") - 1
        parts = []
        for g in np.unique(groups):
            local = wanted[groups == g] - starts[g]
            parts.append(Rows.from_arrow(self._table(i, int(g)).take(local)))
        return Rows.concat(parts)

    def fetch(self, part: Planned) -> Rows:
        """The rows `part` names (its example ids), in its order, with their example ids and epochs; their lengths
        are checked against the plan's."""
        if not len(part):
            empty = np.zeros(0, np.int64)
            return Rows(empty, np.zeros(1, np.int64), empty, empty, np.zeros(1, np.int64), empty, empty, empty, empty)
        shard, row = split_example(part.example)
        pieces, places = [], []
        for s in np.unique(shard):
            sel = np.flatnonzero(shard == s)
            wanted, inverse = np.unique(row[sel], return_inverse=True)
            pieces.append(self.rows(int(s), wanted).take(inverse))
            places.append(sel)
        rows = Rows.concat(pieces).take(np.argsort(np.concatenate(places), kind="stable"))
        rows.example, rows.epoch = part.example, part.epoch
        if not np.array_equal(rows.lengths, part.lengths):
            bad = int(shard[np.flatnonzero(rows.lengths != part.lengths)[0]])
            raise ValueError(f"{self.manifest.shards[bad].url}: rows whose lengths differ from its index's: the "
                             "dataset was changed after its build; rebuild it")
        return rows

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
