"""The pool stage: the random-next pool, a seeded sample of the WHOLE corpus.

    PoolStep   "pool" -> counts the documents whose pool hash is below the threshold, read from the first bands of
               every unit's tokenized documents (read.py): PoolMarker
               [one item: the barrier the algorithm needs, since every instance may draw from any unit's documents]
    LoadPool   the same members merged in (hash, id) order into one table, computed once by a worker and shared

The threshold comes from the exact token count the read pass found (``sizes.pool_threshold``: a share
p = min(1, budget / tokens) of the 64-bit hash range), so the pool is a Bernoulli(p) sample of the documents,
decided by their ids alone, whatever the units, blocks or workers; its order (by hash, then id) does not depend on
them either. The shard items get the merged pool as a shared object (``LoadPool``: an object reference on Ray),
built once per worker process (``pool_for``). The merged pool is never written to _work (for a corpus below the
budget it would be a second copy of every document): a resumed build merges it again from the documents.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus.create_instances import RandomDocPool
from corpus.schema import work_docs_schema
from pipeline.docs import POOL_BANDS, doc_arrays
from pipeline.drops import kept
from pipeline.executor import Shared, Stage
from pipeline.markers import Marker, marker, write_marker
from pipeline.sizes import pool_threshold
from pipeline.state import BuildState
from pipeline.work import StepContext, cached
from storage.fs import filesystem_for

log = logging.getLogger(__name__)

_POOL_READ_THREADS = 16  # pool parts read concurrently by the one pool item (many small objects on S3)


@marker("pool")
class PoolMarker(Marker):
    """The pool's size, counted from the units' members (``LoadPool`` merges them for the shard items)."""

    documents: int
    """Documents in the pool: the random-next draws choose among them."""
    tokens: int
    """Their tokens: about ``pool_tokens`` (binomially around the budget), or the whole corpus's when it is smaller."""
    threshold: int
    """A document is a member when its pool hash is below it: p x 2**64 for a share p (2**64: every document)."""


def pool_from(table: pa.Table) -> RandomDocPool:
    doc_ids, outer, inner, flat = doc_arrays(table)
    return RandomDocPool.from_arrays(doc_ids, flat, inner.astype(np.int64), outer.astype(np.int64))


def pool_for(pool: Shared) -> RandomDocPool:
    """The merged pool, built once per process and build from the shared table (``load_pool``)."""
    return cached("pool", pool.key, lambda: pool_from(pool.get()))


def merge_members(files: tuple[str, ...], threshold: int, ctx: StepContext, dropped: frozenset[str]) -> pa.Table:
    """Every unit's pool members (``read_members``) as one table in (hash, id) order."""
    with concurrent.futures.ThreadPoolExecutor(max(1, min(_POOL_READ_THREADS, len(files)))) as threads:
        tables = list(threads.map(lambda url: read_members(url, threshold, ctx, dropped), files))
    table = pa.concat_tables(tables) if tables else work_docs_schema(ctx.vocab_size).empty_table()
    return table.sort_by([("pool_hash", "ascending"), ("doc_id", "ascending")]).combine_chunks()


@dataclasses.dataclass(frozen=True)
class LoadPool:
    """The merged pool's table, made by a worker from the units' documents: the object the shard items share (an
    object reference on Ray, read once per node's object store rather than once per worker process)."""

    step: PoolStep
    """Which documents are members: the files, the threshold, the drop lists."""

    def __call__(self) -> pa.Table:
        s = self.step
        return merge_members(s.files, s.threshold, s.ctx, s.dropped)


def read_members(url: str, threshold: int, ctx: StepContext, dropped: frozenset[str] = frozenset()) -> pa.Table:
    """A unit's pool members: the bands of its tokenized documents below ``threshold`` (read.py), filtered, without
    what a global step left out (drops.py)."""
    fs, path = filesystem_for(url, ctx.endpoint_url)
    with fs.open(path, "rb", block_size=1 << 16) as fh:
        reader = pa.ipc.open_file(fh)
        batches = [reader.get_batch(k) for k in range(reader.num_record_batches) if POOL_BANDS[k] < threshold]
    table = kept(pa.Table.from_batches(batches, schema=work_docs_schema(ctx.vocab_size)), url, dropped, ctx)
    return table.filter(pc.less(table.column("pool_hash"), pa.scalar(threshold, pa.uint64()))) \
        if threshold < 1 << 64 else table


@dataclasses.dataclass(frozen=True)
class PoolStep:
    """Merge the units' members into one file, in (hash, id) order: instances items then read one object each."""

    ctx: StepContext
    """Where the pool file and its marker go, and the vocabulary's size (uint16 or uint32 ids)."""
    files: tuple[str, ...]
    """Every file of tokenized documents the read pass wrote: the pool samples the whole corpus."""
    threshold: int
    """The pool-hash threshold below which a document is a member (``sizes.pool_threshold``)."""
    dropped: frozenset[str] = frozenset()
    """The files with a drop list (drops.py), whose listed documents stay out of the pool."""

    def __call__(self, item: str) -> PoolMarker:
        ctx = self.ctx
        with concurrent.futures.ThreadPoolExecutor(max(1, min(_POOL_READ_THREADS, len(self.files)))) as threads:
            counts = list(threads.map(lambda url: _count(read_members(url, self.threshold, ctx, self.dropped)),
                                      self.files))
        marker = PoolMarker(documents=sum(d for d, _ in counts), tokens=sum(t for _, t in counts),
                            threshold=self.threshold)
        write_marker(ctx.work, marker, ctx.endpoint_url, ctx.fence)
        return marker


def _count(members: pa.Table) -> tuple[int, int]:
    """(documents, tokens) of a unit's pool members, as ``pool_from`` would hold them."""
    _, _, inner, _ = doc_arrays(members)
    return members.num_rows, int(inner[-1] - inner[0]) if len(inner) else 0


def pool_stage(s: BuildState) -> Stage:
    threshold = pool_threshold(s.cfg.pool_tokens, s.corpus_tokens)
    return Stage("pool", PoolStep(s.ctx, tuple(s.doc_files), threshold, s.dropped), {"pool": "pool"}, PoolMarker,
                 noun="merge", after=_share_pool)


def _share_pool(s: BuildState) -> BuildState:
    """The instances pass gets the merged pool as one shared object, read by a worker (never by the driver)."""
    (pool,) = s.markers["pool"]
    if not pool.documents:  # type: ignore[attr-defined]
        raise ValueError(f"the random-next pool sampled no document with tokens (budget {s.cfg.pool_tokens} tokens"
                         f" of {s.corpus_tokens}): raise --pool-tokens")
    step = PoolStep(s.ctx, tuple(s.doc_files), pool.threshold, s.dropped)  # type: ignore[attr-defined]
    return dataclasses.replace(s, pool=s.executor.share_result(f"pool:{s.build_id}", LoadPool(step)))
