"""The instances pass: a unit's documents turned into NSP pairs + MLM masks for every (document, pass), committed
as the record batches the shards read. A row pipeline (``rows.py``):

    ReadCorpus -> SplitTokenize (members skipped) -> PairsAndMasks -> WriteUnits
                  each unit's instances as _work/instances/<uid>.arrow (each pass's rows as a few record batches),
                  then its InstancesMarker

Reading, splitting and tokenizing a unit and making its instances happen in one process (Ray Data fuses the
chain), so a unit's tokens never leave it. The pool's members are not tokenized again: their tokens come from the
merged pool, which PairsAndMasks holds anyway for the random-next segments. The algorithm is
``pipeline.create_instances.create_instances_flat`` (pure numpy over token ids), fed a block of documents at a time;
each pass's rows are cut into ``chunks`` record batches (``shards.chunk_bounds``) so that a shard can read just its
slices. The encoder, the pool and the vocabulary's ids are loaded once per worker process.
"""
from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.build.config import BuildState
from pipeline.build.docs import ReadCorpus, SplitTokenize, packed_docs, power_of_two_histogram, vocab_info_for
from pipeline.build.executor import Shared
from pipeline.build.markers import Marker, write_marker
from pipeline.build.pool import pool_doc, pool_for
from pipeline.build.rows import RowStage, UserError, by_unit, user_error
from pipeline.build.shards import chunk_bounds, chunks_per_pass
from pipeline.build.work import WORK_SUFFIX, StepContext
from pipeline.create_instances import create_instances_flat
from pipeline.pairs import PackedDoc
from pipeline.schema import token_dtype, work_instance_schema
from pipeline.storage import open_atomic

LIST_COLUMNS = ("input_ids", "masked_lm_positions", "masked_lm_ids")

_INSTANCE_BLOCK_TOKENS = 1 << 20  # instance tokens per block of documents (~10 bytes each while masking)


@dataclasses.dataclass(frozen=True)
class InstancesMarker(Marker):
    """A unit's documents and instances: ``rows[p]`` rows in pass ``p``, cut into ``chunks`` record batches per
    pass; ``documents``, ``sentences``, ``tokens`` count what was kept, ``dropped`` what was not, by reason."""

    stage: ClassVar[str] = "instances"
    uid: str
    path: str
    read_documents: int
    documents: int
    sentences: int
    tokens: int
    dropped: dict[str, int]
    bad_files: dict[str, str]
    rows: tuple[int, ...]
    chunks: int
    random_next: int
    masked: int
    seq_len_histogram: dict[str, int]
    unk_tokens: int  # tokens that are [UNK]: a vocabulary that does not fit the text (pipeline/checks.py)
    tokens_per_document: dict[str, int]  # documents by tokens, in power-of-two bins keyed by their lower bound
    masked_per_seq_histogram: dict[str, int]  # sequences by their number of masked positions

    @property
    def key(self) -> str:
        return self.uid


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


# The order of a unit's instance rows, carried by each row as ``part``: its pass, then the first document of the
# batch it was made in (rows of one batch and pass come in document order). Sorting by it (stably) restores the
# stage-by-stage order, whatever batches the operators were handed.
_PASS_SHIFT = 40


@dataclasses.dataclass(frozen=True)
class PairsAndMasks:
    """Documents with tokens -> NSP pairs and MLM masks for every (document, pass), as instance rows (the _work
    instance columns, plus ``unit`` and ``part``), and per unit one summary row (``summary``: the documents'
    counts, the report row's content) that the sink turns into the unit's marker.

    Members of the random-next pool come untokenized (SplitTokenize skipped them): their tokens are taken from the
    pool, which this operator holds anyway for the random next segments (``pool``: a shared handle, an object
    reference on Ray, built once per process)."""

    ctx: StepContext
    vocab: Shared
    pool: Shared

    def setup(self) -> None:
        vocab_info_for(self.vocab)
        pool_for(self.pool)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.concat_tables([self._unit(uid, rows) for uid, rows in by_unit([batch])])

    def _unit(self, uid: str, rows: pa.Table) -> pa.Table:
        ctx, pool, vocab = self.ctx, pool_for(self.pool), vocab_info_for(self.vocab)
        reports = [r for r in rows.column("report").to_pylist() if r is not None]
        is_doc = pc.invert(pc.is_null(rows.column("id")))
        rows = rows.filter(is_doc)
        ids = rows.column("id").to_pylist()
        ords = rows.column("ord").to_numpy()
        member = rows.column("member").to_numpy(zero_copy_only=False)
        tokenized = rows.column("tokenized").to_numpy(zero_copy_only=False)
        packed = packed_docs(rows)
        for i in np.flatnonzero(member & ~tokenized).tolist():
            code = pool.code(ids[i])  # a member with no tokens is not in the pool: it has none here either
            packed[i] = pool_doc(pool, code) if code >= 0 else None
        docs = [(d, p) for d, p in zip(ids, packed) if p is not None]
        summary = {"seen": len(ids), "documents": len(docs), "no_tokens": len(ids) - len(docs),
                   "sentences": sum(len(d.sent_offsets) - 1 for _, d in docs),
                   "tokens": sum(len(d.tokens) for _, d in docs),
                   "unk_tokens": sum(int(np.count_nonzero(d.tokens == vocab.unk_id)) for _, d in docs),
                   "tokens_per_document": power_of_two_histogram([len(d.tokens) for _, d in docs]),
                   "report": json.loads(reports[0]) if reports else None}
        first = int(ords[0]) if len(ords) else 0
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

        for doc in docs:
            block.append(doc)
            block_tokens += len(doc[1].tokens)
            if block_tokens * ctx.dupe_factor >= _INSTANCE_BLOCK_TOKENS:
                flush()
                block_tokens = 0
        if block:
            flush()
        tables = []
        for p in passes:
            t = _table(parts[p], ctx.vocab_size)
            parts[p] = []
            tables.append(t.append_column("unit", pa.array([uid] * t.num_rows, pa.string()))
                          .append_column("part", pa.array(np.full(t.num_rows, (p << _PASS_SHIFT) + first, np.int64)))
                          .append_column("summary", pa.nulls(t.num_rows, pa.string())))
        schema = tables[0].schema
        tail = {f.name: pa.nulls(1, f.type) for f in schema}
        tail |= {"unit": pa.array([uid], pa.string()), "part": pa.array([-1], pa.int64()),
                 "summary": pa.array([json.dumps(summary, sort_keys=True)], pa.string())}
        return pa.concat_tables(tables + [pa.table(tail, schema=schema)])


def _merge(summaries: list[dict]) -> dict:
    """One unit's summary rows (one per batch it was made in) as one."""
    out: dict = {"tokens_per_document": Counter()}
    for s in summaries:
        for k in ("seen", "documents", "no_tokens", "sentences", "tokens", "unk_tokens"):
            out[k] = out.get(k, 0) + s[k]
        out["tokens_per_document"].update(s["tokens_per_document"])
        if s["report"] is not None:
            assert "report" not in out, "two report rows for one unit"
            out["report"] = s["report"]
    return out


def write_unit(uid: str, rows: pa.Table, ctx: StepContext, chunks: int) -> InstancesMarker | UserError:
    """Commit one unit's instance rows (all of them: checked against its report row) as
    ``_work/instances/<uid>.arrow``, each pass's rows cut into ``chunks`` record batches (contiguous, sizes differing
    by at most one row; batch ``p * chunks + c``), what the shards read; then its marker."""
    is_summary = pc.invert(pc.is_null(rows.column("summary")))
    s = _merge([json.loads(x) for x in rows.filter(is_summary).column("summary").to_pylist()])
    report = s.get("report")
    assert report is not None, f"unit {uid}: no report row among its rows"
    if (err := user_error(report)) is not None:
        return err
    assert s["seen"] == report["read_documents"], (uid, s["seen"], report["read_documents"])
    dropped = Counter(report["dropped"])
    if s["no_tokens"]:
        dropped["no_tokens"] += s["no_tokens"]  # the reference removes documents left empty
    inst = rows.filter(pc.invert(is_summary))
    # Rows in document order within each pass: the shard writer orders its rows by key (sorting here too would
    # copy every row once more for nothing).
    part = inst.column("part").to_numpy()
    inst = inst.take(pa.array(np.argsort(part, kind="stable"))) if len(part) else inst
    pass_of = np.sort(part, kind="stable") >> _PASS_SHIFT
    schema = work_instance_schema(ctx.vocab_size)
    inst = inst.select(schema.names).cast(schema)
    rows_per_pass, hist, masked_hist, random_next, masked = [], Counter(), Counter(), 0, 0
    with open_atomic(ctx.url("instances", uid + WORK_SUFFIX), ctx.endpoint_url) as f:
        with pa.ipc.new_file(f, schema) as w:
            for p in range(ctx.dupe_factor):
                lo, hi = np.searchsorted(pass_of, [p, p + 1])
                table = inst.slice(lo, hi - lo).combine_chunks()
                for a, b in chunk_bounds(table.num_rows, chunks):
                    batches = table.slice(a, b - a).to_batches()
                    w.write_batch(batches[0] if batches else pa.RecordBatch.from_pylist([], schema=schema))
                rows_per_pass.append(table.num_rows)
                if table.num_rows:
                    lengths = np.diff(table.column("input_ids").chunk(0).offsets.to_numpy())
                    hist.update({k: v for k, v in enumerate(np.bincount(lengths).tolist()) if v})
                    per_seq = np.diff(table.column("masked_lm_positions").chunk(0).offsets.to_numpy())
                    masked_hist.update({k: v for k, v in enumerate(np.bincount(per_seq).tolist()) if v})
                    random_next += int(pc.sum(table.column("next_sentence_label")).as_py())
                    masked += int(per_seq.sum())
    marker = InstancesMarker(
        uid=uid, path=report["path"], read_documents=report["read_documents"], documents=s["documents"],
        sentences=s["sentences"], tokens=s["tokens"], dropped=dict(dropped), bad_files=report["bad_files"],
        rows=tuple(rows_per_pass), chunks=chunks, random_next=random_next, masked=masked,
        seq_len_histogram={str(k): int(v) for k, v in sorted(hist.items()) if v}, unk_tokens=s["unk_tokens"],
        tokens_per_document=dict(s["tokens_per_document"]),
        masked_per_seq_histogram={str(k): int(v) for k, v in sorted(masked_hist.items())})
    write_marker(ctx.work, marker, ctx.endpoint_url, ctx.fence)
    return marker


@dataclasses.dataclass(frozen=True)
class WriteUnits:
    """The instances pass's sink: each unit's instances committed atomically, then its marker (``write_unit``), so
    a rerun plans only the units without one."""

    ctx: StepContext
    chunks: int = 1  # record batches per pass (shards.chunks_per_pass)

    def write(self, tables: list[pa.Table]) -> list[InstancesMarker | UserError]:
        return [write_unit(uid, rows, self.ctx, self.chunks) for uid, rows in by_unit(tables)]


def instances_stage(s: BuildState) -> RowStage:
    assert s.pool is not None, "the instances pass runs after the pool's merge"
    chunks = chunks_per_pass(len(s.units), s.cfg.dupe_factor, s.num_shards)
    return RowStage("instances", {u.uid: u for u in s.units}, ReadCorpus(s.ctx),
                    (SplitTokenize(s.ctx, s.vocab, members="skip"), PairsAndMasks(s.ctx, s.vocab, s.pool)),
                    WriteUnits(s.ctx, chunks), InstancesMarker, s.unit_sizes)
