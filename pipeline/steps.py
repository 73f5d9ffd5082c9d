"""The build's steps: picklable callables over one work item, run by any executor (``pipeline/executor.py``).

Each step commits its output file(s) atomically and then its typed marker (``pipeline/markers.py``): an item with a
marker is done and skipped on resume; an item without one is redone from scratch, overwriting any leftover.

    DocsStep       unit -> _work/docs/<uid>.arrow, its pool members -> _work/pool/parts/<uid>.arrow, DocsMarker
    PoolStep       "pool" -> the parts merged, in unit order, into _work/pool/pool.arrow, PoolMarker  [one task]
    InstancesStep  uid -> _work/instances/<uid>.arrow: each pass's rows as a few record batches, InstancesMarker
    ShardStep      ShardTask (its own slices only) -> shards/part-i-of-S.parquet, ShardMarker

Random-next pool: a document is a member when ``derive_seed(seed, doc_id, "pool") < ctx.pool_threshold``, a
threshold the driver sets from the planned input size before any work (``pool_threshold``), so membership is a
seeded Bernoulli sample of the whole corpus that each docs task decides for its own documents. Expensive per-process
state (the WordPiece encoder, the vocabulary's ids, the pool) is loaded once per process and cached by build.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.executor import Shared
from pipeline.instances import InstanceConfig, RandomDocPool, VocabInfo, create_instances_flat
from pipeline.markers import DocsMarker, InstancesMarker, PoolMarker, ShardMarker, write_marker
from pipeline.pairs import PackedDoc
from pipeline.readers import ReadOptions, ReadReport, Unit, read_unit
from pipeline.rng import derive_seed
from pipeline.schema import instance_schema, shard_name, token_dtype, work_docs_schema, work_instance_schema
from pipeline.shards import WORK_SUFFIX, ShardTask, chunk_bounds, read_work_table, write_shard, write_work_table
from pipeline.storage import filesystem_for, join, open_atomic

log = logging.getLogger(__name__)

LIST_COLUMNS = ("input_ids", "masked_lm_positions", "masked_lm_ids")

_ENCODE_BATCH = 20000  # sentences per encode call: bounds the tokenizer's temporary memory
_INSTANCE_BLOCK_TOKENS = 1 << 20  # instance tokens per block of documents (~10 bytes each while masking)
_POOL_READ_THREADS = 16  # pool parts read concurrently by the one pool task (many small objects on S3)


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What the steps need (never the whole job config): where _work is, the component configs, and ``build_id``
    (a hash of the config and the input stamps) that keys the per-process caches."""

    work: str
    output: str
    read: ReadOptions
    instances: InstanceConfig
    do_lower_case: bool
    dupe_factor: int
    vocab_size: int
    pool_threshold: int  # a document is in the pool when its seeded 64-bit hash is below this (2**64: all)
    build_id: str
    endpoint_url: str | None = None

    def url(self, *parts: str) -> str:
        return join(self.work, *parts)

    def pool_url(self) -> str:
        return self.url("pool", "pool" + WORK_SUFFIX)

    def pool_part_url(self, uid: str) -> str:
        return self.url("pool", "parts", uid + WORK_SUFFIX)


# --- per-process caches: Ray reuses its worker processes across tasks, so each loads these once per build.
_CACHE: dict[str, tuple[Any, Any]] = {}


def _cached(slot: str, key: Any, load) -> Any:
    hit = _CACHE.get(slot)
    if hit is None or hit[0] != key:
        _CACHE[slot] = (key, None)  # drop the old value before loading the new one (one pool in memory)
        _CACHE[slot] = (key, load())
    return _CACHE[slot][1]


def encoder_for(vocab: Shared, do_lower_case: bool):
    """One WordPiece encoder per process and vocabulary; its word cache stays warm from unit to unit."""
    def load():
        from pipeline.tokenize import WordPieceEncoder

        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per task: the executor gives the parallelism
        return WordPieceEncoder(tokens=vocab.get(), do_lower_case=do_lower_case)
    return _cached("encoder", (vocab.key, do_lower_case), load)


def vocab_info_for(vocab: Shared) -> VocabInfo:
    return _cached("vocab_info", vocab.key, lambda: VocabInfo.from_tokens(vocab.get()))


def pool_for(ctx: StepContext) -> RandomDocPool:
    """The merged pool, read once per process and build."""
    return _cached("pool", (ctx.pool_url(), ctx.build_id), lambda: _pool_from(read_table(ctx.pool_url(), ctx)))


def read_table(url: str, ctx: StepContext) -> pa.Table:
    fs, path = filesystem_for(url, ctx.endpoint_url)
    with fs.open(path, "rb") as f:
        return read_work_table(f)


def _write_table(url: str, table: pa.Table, ctx: StepContext) -> None:
    with open_atomic(url, ctx.endpoint_url) as f:
        write_work_table(f, table)


# --- docs


@dataclasses.dataclass
class SplitUnit:
    uid: str
    path: str
    doc_ids: list[str]
    sentences: list[list[str]]
    report: ReadReport


def read_split(unit: Unit, ctx: StepContext) -> SplitUnit:
    """Read one unit's documents and split them into sentences (lines, with presplit)."""
    from pipeline.sentences import split_sentences

    report = ReadReport()
    doc_ids, sentences = [], []
    for doc in read_unit(unit, ctx.read, ctx.endpoint_url, report):
        if ctx.read.presplit:
            sents = [s.strip() for line in doc.lines for s in line.split("\n")]
        else:
            sents = split_sentences(" ".join(doc.lines))
        doc_ids.append(doc.doc_id)
        sentences.append([s for s in sents if s and not s.isspace()])
    return SplitUnit(unit.uid, unit.path, doc_ids, sentences, report)


def tokenize_commit(split: SplitUnit, ctx: StepContext, encoder) -> DocsMarker:
    """WordPiece the unit's sentences; commit its documents, then its pool members, then the marker."""
    flat = [s for sents in split.sentences for s in sents]
    parts = [encoder.encode_flat(flat[i:i + _ENCODE_BATCH]) for i in range(0, len(flat), _ENCODE_BATCH)]
    del flat
    dtype = token_dtype(ctx.vocab_size)
    # Vectorised bookkeeping over all sentences of the unit (no Python loop per sentence).
    lens = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
    values = np.concatenate([p[0] for p in parts]).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
    del parts
    n_per_doc = np.array([len(s) for s in split.sentences], dtype=np.int64)
    doc_of_sent = np.repeat(np.arange(len(n_per_doc)), n_per_doc)
    keep = lens > 0  # the reference drops lines with no tokens ...
    kept_per_doc = np.bincount(doc_of_sent[keep], minlength=len(n_per_doc))
    tok_per_doc = np.bincount(doc_of_sent, weights=lens, minlength=len(n_per_doc)).astype(np.int64)
    doc_keep = kept_per_doc > 0  # ... and removes documents left empty; we count them
    dropped = Counter(split.report.dropped)
    if (~doc_keep).sum():
        dropped["no_tokens"] += int((~doc_keep).sum())
    doc_ids = [d for d, k in zip(split.doc_ids, doc_keep.tolist()) if k]
    inner = np.zeros(int(keep.sum()) + 1, dtype=np.int32)
    np.cumsum(lens[keep], out=inner[1:])
    outer = np.zeros(len(doc_ids) + 1, dtype=np.int32)
    np.cumsum(kept_per_doc[doc_keep], out=outer[1:])
    sentences = pa.ListArray.from_arrays(pa.array(outer), pa.ListArray.from_arrays(pa.array(inner), pa.array(values)))
    table = pa.Table.from_arrays([pa.array(doc_ids, pa.string()), sentences], schema=work_docs_schema(ctx.vocab_size))
    _write_table(ctx.url("docs", split.uid + WORK_SUFFIX), table, ctx)
    seed = ctx.instances.seed
    member = np.array([derive_seed(seed, d, "pool") < ctx.pool_threshold for d in doc_ids], dtype=bool)
    pool_tokens = int(tok_per_doc[doc_keep][member].sum()) if len(doc_ids) else 0
    if member.any():
        _write_table(ctx.pool_part_url(split.uid), table.filter(pa.array(member)), ctx)
    marker = DocsMarker(uid=split.uid, path=split.path, documents=len(doc_ids), sentences=int(keep.sum()),
                        tokens=int(lens.sum()), read_documents=len(split.doc_ids), dropped=dict(dropped),
                        bad_files=dict(split.report.bad_files), pool_documents=int(member.sum()),
                        pool_tokens=pool_tokens)
    write_marker(ctx.work, marker, ctx.endpoint_url)
    return marker


@dataclasses.dataclass(frozen=True)
class DocsStep:
    """Read, split, tokenize and commit one unit in one process: its sentences never cross a process boundary."""

    ctx: StepContext
    vocab: Shared

    def setup(self) -> None:
        import pyarrow.compute  # noqa: F401 - imported here so a warm worker's first unit does not pay for it

        import pipeline.sentences  # noqa: F401
        encoder_for(self.vocab, self.ctx.do_lower_case)

    def __call__(self, unit: Unit) -> DocsMarker:
        return tokenize_commit(read_split(unit, self.ctx), self.ctx, encoder_for(self.vocab, self.ctx.do_lower_case))


# --- pool


def _pool_from(table: pa.Table) -> RandomDocPool:
    doc_ids, outer, inner, flat = _doc_arrays(table)
    return RandomDocPool.from_arrays(doc_ids, flat, inner.astype(np.int64), outer.astype(np.int64))


@dataclasses.dataclass(frozen=True)
class PoolStep:
    """Merge the units' pool parts, in unit order (the pool's document order), into one file: instances tasks then
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
        _write_table(ctx.pool_url(), table, ctx)
        pool = _pool_from(table)
        marker = PoolMarker(documents=len(pool), tokens=int(len(pool.tokens)))
        write_marker(ctx.work, marker, ctx.endpoint_url)
        return marker


# --- instances


def _doc_arrays(table: pa.Table) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(doc ids, sentences per document as offsets, token offsets per sentence, tokens) of a _work docs table."""
    col = table.column("sentences").combine_chunks()
    if not len(col):
        return [], np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(0, np.uint16)
    inner = col.values
    return (table.column("doc_id").to_pylist(), col.offsets.to_numpy(), inner.offsets.to_numpy(),
            inner.values.to_numpy())


def iter_docs(table: pa.Table) -> Iterator[tuple[str, PackedDoc]]:
    """(doc_id, packed document) from a _work docs table, the tokens as zero-copy numpy views."""
    doc_ids, outer, inner, flat = _doc_arrays(table)
    for i, doc_id in enumerate(doc_ids):
        s0, s1 = outer[i], outer[i + 1]
        t0 = inner[s0]
        yield doc_id, PackedDoc(flat[t0 : inner[s1]], (inner[s0 : s1 + 1] - t0).astype(np.int64))


def _table(parts: list[dict], vocab_size: int) -> pa.Table:
    """The flat instance columns of several blocks as one table of the _work instance schema."""
    schema = work_instance_schema(vocab_size)
    if not parts:
        return schema.empty_table()
    dtype = token_dtype(vocab_size)

    def column(name: str, np_dtype) -> pa.Array:
        if name in LIST_COLUMNS:  # (values, offsets) per block -> one list array
            values = np.concatenate([p[name][0] for p in parts]).astype(np_dtype, copy=False)
            lengths = np.concatenate([np.diff(p[name][1]) for p in parts])
            offsets = np.zeros(len(lengths) + 1, np.int32)
            np.cumsum(lengths, out=offsets[1:])
            return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        return pa.array(np.concatenate([p[name] for p in parts]).astype(np_dtype, copy=False))

    return pa.Table.from_arrays([
        column("input_ids", dtype), column("a_length", np.int16), column("masked_lm_positions", np.uint16),
        column("masked_lm_ids", dtype), column("next_sentence_label", np.int8), column("key", np.uint64),
    ], schema=schema)


def instances_step(uid: str, ctx: StepContext, pool: RandomDocPool, vocab: VocabInfo, chunks: int = 1
                   ) -> InstancesMarker:
    """NSP pairs + MLM masks for every (document, pass) of a unit; each pass's rows cut into ``chunks`` record
    batches (contiguous, sizes differing by at most one row; batch ``p * chunks + c``), what the shards read."""
    passes = range(ctx.dupe_factor)
    parts: list[list[dict]] = [[] for _ in passes]
    block: list[tuple[str, PackedDoc]] = []
    block_tokens = 0

    def flush() -> None:
        # A pass's rows do not depend on the other passes (each draws from its own stream): one call per pass
        # keeps every pass's rows apart for the shards, at one numpy pass per block and pass.
        for p in passes:
            out = create_instances_flat(block, [p], ctx.instances, pool, vocab)
            if out is not None:
                parts[p].append(out)
        block.clear()

    for doc_id, doc in iter_docs(read_table(ctx.url("docs", uid + WORK_SUFFIX), ctx)):
        block.append((doc_id, doc))
        block_tokens += len(doc.tokens)
        if block_tokens * ctx.dupe_factor >= _INSTANCE_BLOCK_TOKENS:
            flush()
            block_tokens = 0
    if block:
        flush()
    schema = work_instance_schema(ctx.vocab_size)
    rows, hist, random_next, masked = [], Counter(), 0, 0
    with open_atomic(ctx.url("instances", uid + WORK_SUFFIX), ctx.endpoint_url) as f:
        with pa.ipc.new_file(f, schema) as w:
            for p in passes:
                # Rows stay in document order: the shard writer orders its rows by key (sorting here too would
                # copy every row once more for nothing).
                table = _table(parts[p], ctx.vocab_size).combine_chunks()
                for a, b in chunk_bounds(table.num_rows, chunks):
                    batches = table.slice(a, b - a).to_batches()
                    w.write_batch(batches[0] if batches else pa.RecordBatch.from_pylist([], schema=schema))
                rows.append(table.num_rows)
                if parts[p]:
                    lengths = np.concatenate([np.diff(x["input_ids"][1]) for x in parts[p]])
                    hist.update({k: v for k, v in enumerate(np.bincount(lengths).tolist()) if v})
                random_next += int(sum(int(x["next_sentence_label"].sum()) for x in parts[p]))
                masked += int(sum(len(x["masked_lm_positions"][0]) for x in parts[p]))
                parts[p] = []
    marker = InstancesMarker(uid=uid, rows=tuple(rows), chunks=chunks, random_next=random_next, masked=masked,
                             seq_len_histogram={str(k): int(v) for k, v in sorted(hist.items()) if v})
    write_marker(ctx.work, marker, ctx.endpoint_url)
    return marker


@dataclasses.dataclass(frozen=True)
class InstancesStep:
    ctx: StepContext
    vocab: Shared
    chunks: int = 1  # record batches per pass (shards.chunks_per_pass)

    def setup(self) -> None:
        vocab_info_for(self.vocab)
        pool_for(self.ctx)

    def __call__(self, uid: str) -> InstancesMarker:
        return instances_step(uid, self.ctx, pool_for(self.ctx), vocab_info_for(self.vocab), self.chunks)


# --- shards


@dataclasses.dataclass(frozen=True)
class ShardStep:
    ctx: StepContext

    def __call__(self, task: ShardTask) -> ShardMarker:
        ctx = self.ctx
        name = shard_name(task.index, task.count)
        rows = write_shard(task, join(ctx.output, name), lambda uid: ctx.url("instances", uid + WORK_SUFFIX),
                           instance_schema(ctx.vocab_size), ctx.endpoint_url)
        assert rows == task.rows, (rows, task.rows)
        marker = ShardMarker(index=task.index, file=name, rows=rows)
        write_marker(ctx.work, marker, ctx.endpoint_url)
        return marker
