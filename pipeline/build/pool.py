"""The pool stages: the random-next pool, a seeded sample of the WHOLE corpus, tokenized and merged into one file.

    pool parts    ReadCorpus -> SplitTokenize (members only) -> WritePoolParts: a unit's members, tokenized, as
                  _work/pool/parts/<uid>.arrow, then its PoolPartMarker (a row pipeline, rows.py)
    PoolStep      "pool" -> the parts merged, in unit order, into _work/pool/pool.arrow, PoolMarker
                  [one item: the barrier the algorithm needs, since every instance may draw from any unit's members]

The sample is planned before any text is read: ``pool_threshold`` turns the token budget and the input's planned
size (``planned_tokens``, from metadata only) into a 64-bit hash threshold, and a unit's members are the documents
whose seeded hash falls below it (``docs.pool_members``): decided from document ids, so only the members are split
and tokenized here. The instances pass gets the merged pool as a shared object (``LoadPool``: an object reference
on Ray), builds it once per worker process (``pool_for``) and takes the members' tokens from it instead of
tokenizing them again.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.build.config import BuildState
from pipeline.build.docs import (ReadCorpus, SplitTokenize, doc_arrays, doc_totals, docs_table, packed_docs,
                                 vocab_info_for)
from pipeline.build.executor import Shared, Stage
from pipeline.build.rows import RowStage, UserError, by_unit, report_of, user_error
from pipeline.build.markers import Marker, write_marker
from pipeline.build.work import StepContext, cached, read_table, write_table
from pipeline.create_instances import RandomDocPool
from pipeline.pairs import PackedDoc
from pipeline.readers import ReadOptions, Unit, detect_format
from pipeline.schema import work_docs_schema
from pipeline.storage import FileInfo, compression_of

# Planning the random-next pool before any text is read: tokens are estimated from the input's size. ~4.2 bytes of
# English text per WordPiece token (bert-base-uncased on Moby Dick, news, docs); 4.0 errs towards a pool a little
# under the budget. Compressed inputs count COMPRESSED_RATIO text bytes per stored byte.
BYTES_PER_TOKEN = 4.0
COMPRESSED_RATIO = 3  # text compresses ~3x (gzip/zstd/Parquet+zstd); only the pool's threshold uses it
_POOL_READ_THREADS = 16  # pool parts read concurrently by the one pool item (many small objects on S3)


@dataclasses.dataclass(frozen=True)
class PoolPartMarker(Marker):
    """A unit's pool members committed (none: no file); what the reader saw of the unit, so that empty inputs and
    inputs without documents fail before the instances stage."""

    stage: ClassVar[str] = "pool_parts"
    uid: str
    path: str
    read_documents: int
    dropped: dict[str, int]
    bad_files: dict[str, str]
    documents: int  # members with at least one token
    tokens: int
    unk_tokens: int  # the members' [UNK]: an early, sampled look at how the vocabulary fits (pipeline/checks.py)

    @property
    def key(self) -> str:
        return self.uid


@dataclasses.dataclass(frozen=True)
class PoolMarker(Marker):
    """The pool parts of all units merged into one file that every instances item loads once per process."""

    stage: ClassVar[str] = "pool"
    documents: int
    tokens: int

    @property
    def key(self) -> str:
        return "pool"


def planned_tokens(files: list[FileInfo], units: list[Unit], read: ReadOptions) -> int:
    """Tokens the inputs should hold, from metadata alone (no reads): listed sizes, and for big compressed inputs
    the decompressed sizes of their pieces, so that a ``.gz`` and the same text uncompressed plan the same pool."""
    pieces = [u for u in units if u.data is not None]
    text_bytes = sum(u.end - u.start for u in pieces)
    cut = {u.path for u in pieces}
    for f in files:
        if f.path not in cut:
            packed = compression_of(f.path) or detect_format(f.path, read.fmt) == "parquet"
            text_bytes += f.size * (COMPRESSED_RATIO if packed else 1)
    return max(1, int(text_bytes / BYTES_PER_TOKEN))


def pool_threshold(pool_tokens: int, planned: int) -> int:
    """The 64-bit hash threshold that makes the pool a p = min(1, budget / planned tokens) sample of documents."""
    p = min(1.0, pool_tokens / planned)
    return 1 << 64 if p >= 1.0 else int(p * (1 << 64))


def write_pool_part(uid: str, rows: pa.Table, ctx: StepContext, unk_id: int) -> PoolPartMarker | UserError:
    """Commit one unit's members (SplitTokenize's rows, in unit order), then the marker."""
    report = report_of(rows)
    if (err := user_error(report)) is not None:
        return err
    docs = rows.filter(pc.invert(pc.is_null(rows.column("id"))))
    members = [(i, d) for i, d in zip(docs.column("id").to_pylist(), packed_docs(docs)) if d is not None]
    if members:
        write_table(ctx.pool_part_url(uid), docs_table(members, ctx.vocab_size), ctx)
    marker = PoolPartMarker(uid=uid, path=report["path"], read_documents=report["read_documents"],
                            dropped=report["dropped"], bad_files=report["bad_files"],
                            documents=len(members), tokens=int(sum(len(d.tokens) for _, d in members)),
                            unk_tokens=sum(int(np.count_nonzero(d.tokens == unk_id)) for _, d in members))
    write_marker(ctx.work, marker, ctx.endpoint_url, ctx.fence)
    return marker


@dataclasses.dataclass(frozen=True)
class WritePoolParts:
    """The pool pass's sink: each unit's members committed as ``_work/pool/parts/<uid>.arrow``, then its marker."""

    ctx: StepContext
    vocab: Shared

    def write(self, tables: list[pa.Table]) -> list[PoolPartMarker | UserError]:
        unk_id = vocab_info_for(self.vocab).unk_id
        return [write_pool_part(uid, rows, self.ctx, unk_id) for uid, rows in by_unit(tables)]


def pool_parts_stage(s: BuildState) -> RowStage:
    ctx = s.ctx
    return RowStage("pool_parts", {u.uid: u for u in s.units}, ReadCorpus(ctx),
                    (SplitTokenize(ctx, s.vocab, members="only"),), WritePoolParts(ctx, s.vocab), PoolPartMarker,
                    s.unit_sizes)


def pool_from(table: pa.Table) -> RandomDocPool:
    doc_ids, outer, inner, flat = doc_arrays(table)
    return RandomDocPool.from_arrays(doc_ids, flat, inner.astype(np.int64), outer.astype(np.int64))


def pool_for(pool: Shared) -> RandomDocPool:
    """The merged pool, built once per process and build from the shared table (``load_pool``)."""
    return cached("pool", pool.key, lambda: pool_from(pool.get()))


@dataclasses.dataclass(frozen=True)
class LoadPool:
    """The merged pool's table, read from _work by a worker: the object the instances pass shares (an object
    reference on Ray, read once per node's object store rather than once per worker process from storage)."""

    ctx: StepContext

    def __call__(self) -> pa.Table:
        return read_table(self.ctx.pool_url(), self.ctx)


def pool_doc(pool: RandomDocPool, i: int) -> PackedDoc:
    """Document ``i`` of the pool as the instances stage takes it (zero-copy views of the pool's arrays)."""
    s0, s1 = pool.doc_offsets[i], pool.doc_offsets[i + 1]
    t0 = pool.sent_offsets[s0]
    return PackedDoc(pool.tokens[t0:pool.sent_offsets[s1]], pool.sent_offsets[s0:s1 + 1] - t0)


@dataclasses.dataclass(frozen=True)
class PoolStep:
    """Merge the units' pool parts, in unit order (the pool's document order), into one file: instances items then
    read one object each instead of one per unit."""

    ctx: StepContext
    uids: tuple[str, ...]  # the units that have members, in unit order

    def __call__(self, item: str) -> PoolMarker:
        ctx = self.ctx
        urls = [ctx.pool_part_url(u) for u in self.uids]
        with concurrent.futures.ThreadPoolExecutor(max(1, min(_POOL_READ_THREADS, len(urls)))) as threads:
            tables = list(threads.map(lambda u: read_table(u, ctx), urls))
        schema = work_docs_schema(ctx.vocab_size)
        table = pa.concat_tables(tables).combine_chunks() if tables else schema.empty_table()
        write_table(ctx.pool_url(), table, ctx)
        pool = pool_from(table)
        marker = PoolMarker(documents=len(pool), tokens=int(len(pool.tokens)))
        write_marker(ctx.work, marker, ctx.endpoint_url, ctx.fence)
        return marker


def pool_stage(s: BuildState) -> Stage:
    parts: list[PoolPartMarker] = s.markers["pool_parts"]  # type: ignore[assignment]
    dropped, _ = doc_totals(parts, s.report, s.cfg.read.on_error)  # fails early on empty files
    if sum(m.read_documents for m in parts) == 0:
        raise ValueError(f"no documents in {list(s.cfg.inputs)} (dropped: {dict(dropped)}); check the"
                         " --format/--text-field and the inputs")
    if not any(m.documents for m in parts):
        everything = s.ctx.pool_threshold >= 1 << 64
        raise ValueError(f"no documents with tokens in {list(s.cfg.inputs)} (dropped: {dict(dropped)}); check the"
                         " --format/--text-field and the inputs" if everything else f"the random-next pool sampled no document with tokens (budget "
                         f"{s.cfg.pool_tokens} tokens of an estimated {s.planned_tokens}): raise --pool-tokens")
    return Stage("pool", PoolStep(s.ctx, tuple(m.uid for m in parts if m.documents)), {"pool": "pool"},
                 PoolMarker, noun="merge")
