"""The instances pass: a unit's tokenized documents (read.py) turned into NSP pairs + MLM masks for every
(document, pass), committed as the record batches the shards read. A row pipeline (``rows.py``):

    ReadDocs -> PairsAndMasks -> WriteUnits
                each unit's instances as _work/instances/<uid>.arrow (each pass's rows as a few record batches),
                then its InstancesMarker

It reads what the read pass committed, never the input. The algorithm is
``corpus.create_instances.create_instances_flat`` (pure numpy over token ids), fed a block of documents at a time;
each pass's rows are cut into ``chunks`` record batches (``shards.chunk_bounds``) so that a shard can read just its
slices. The pool and the vocabulary's ids are loaded once per worker process.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus.create_instances import create_instances_flat
from corpus.pairs import PackedDoc
from corpus.readers import Unit
from corpus.schema import token_dtype, work_instance_schema
from pipeline.docs import doc_arrays, docs_url, vocab_info_for
from pipeline.drops import copies_of, kept
from pipeline.executor import Shared
from pipeline.markers import Marker, marker, write_marker
from pipeline.pool import pool_for
from pipeline.rows import RowStage, UserError, by_unit, take_ops, user_error
from pipeline.shards import chunk_bounds, chunks_per_pass
from pipeline.state import BuildState
from pipeline.work import WORK_SUFFIX, StepContext, read_table
from storage.fs import open_atomic

log = logging.getLogger(__name__)

LIST_COLUMNS = ("input_ids", "masked_lm_positions", "masked_lm_ids")

_INSTANCE_BLOCK_TOKENS = 1 << 20  # instance tokens per block of documents (~10 bytes each while masking)


@marker("instances")
class InstancesMarker(Marker):
    """A unit's instances: ``rows[p]`` rows in pass ``p``, cut into ``chunks`` record batches per pass, and what
    they hold (the documents they came from are counted by the read pass's marker)."""

    uid: str
    """The unit's id: the marker's key."""
    documents: int
    """Documents the pass made instances from: the unit's tokenized documents less what drop lists removed."""
    rows: tuple[int, ...]
    """Instance rows per pass (``dupe_factor`` entries): where each pass's rows sit in the shards' global order."""
    chunks: int
    """Record batches each pass's rows are cut into (``shards.chunks_per_pass``): the pieces a shard reads."""
    random_next: int
    """Rows whose segment B is a random document's (``next_sentence_label`` 1), over every pass."""
    masked: int
    """Masked LM positions over every row and pass."""
    seq_len_histogram: dict[str, int]
    """Rows by sequence length in tokens ([CLS] and [SEP] included), keyed by the length as str (JSON keys)."""
    masked_per_seq_histogram: dict[str, int]
    """Rows by their number of masked positions, keyed by that number as str (JSON keys)."""
    ops: dict[str, tuple] = dataclasses.field(default_factory=dict)
    """The operators' statistics for the unit (``rows.take_ops``): rows in and out, bytes out, CPU and wall
    seconds, by operator."""


@dataclasses.dataclass(frozen=True)
class ReadDocs:
    """The instances pass's read: a unit's tokenized documents (``read.py``) as rows (``unit``, ``ord``, ``id``,
    ``sentences``) and a report row holding how many there are, so the sink knows it has all of them."""

    ctx: StepContext
    """Where the unit's docs file is in _work and the endpoint that serves it."""
    dropped: frozenset[str] = frozenset()
    """The docs files a global step gave a drop list (drops.py): their listed documents are left out."""
    copied: frozenset[str] = frozenset()
    """The docs files with a copies list (--mix weights above 1; drops.py): their listed documents are made more
    than once."""

    def __call__(self, unit: Unit) -> pa.Table:
        error, copies = None, None
        if unit.fmt == "documents":  # a unit of a Dataset's documents: its part of the fragments
            from pipeline.ray_data.documents import read_dataset_unit

            table, error = read_dataset_unit(unit, self.ctx, self.dropped)
        else:
            url = docs_url(self.ctx, unit.uid)
            table = kept(read_table(url, self.ctx), url, self.dropped, self.ctx)
            copies = copies_of(table, url, self.copied, self.ctx)
        n = table.num_rows
        tail = pa.table({"doc_id": pa.nulls(1, pa.string()), "pool_hash": pa.nulls(1, pa.uint64()),
                         "sentences": pa.nulls(1, table.schema.field("sentences").type)}, schema=table.schema)
        table = pa.concat_tables([table, tail]).rename_columns(["id", "pool_hash", "sentences"])
        if copies is not None:
            table = table.append_column("copies", pa.array(np.append(copies, 1), pa.int64()))
        return (table.drop_columns(["pool_hash"])
                .append_column("unit", pa.array([unit.uid] * (n + 1), pa.string()))
                .append_column("ord", pa.array(np.arange(n + 1, dtype=np.int64)))
                .append_column("report", pa.array([None] * n + [json.dumps(
                    {"documents": n} | ({"error": ["InputError", error]} if error else {}))], pa.string())))


def _docs(rows: pa.Table) -> list[tuple[str, PackedDoc]]:
    """The documents of ReadDocs's rows as (id, PackedDoc) views of one flat array."""
    ids, outer, inner, flat = doc_arrays(rows, "id")
    inner = inner.astype(np.int64)
    docs = []
    for i, d in enumerate(ids):
        s0, s1 = outer[i], outer[i + 1]
        docs.append((d, PackedDoc(flat[inner[s0]:inner[s1]], inner[s0:s1 + 1] - inner[s0])))
    return docs


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
    """Documents -> NSP pairs and MLM masks for every (document, pass), as instance rows (the _work instance
    columns, plus ``unit`` and ``part``), and per unit one summary row (``summary``: the documents seen, the report
    row's content) that the sink turns into the unit's marker. ``pool``: the random-next pool, a shared handle (an
    object reference on Ray), built once per process."""

    ctx: StepContext
    """The instance settings, the passes (``dupe_factor``) and the vocabulary's size (uint16 or uint32 ids)."""
    vocab: Shared
    """The vocabulary's tokens: the special ids, the ## pieces whole-word masking groups, and the ids random
    replacements are drawn from."""
    pool: Shared
    """The merged random-next pool's table, built into a ``RandomDocPool`` once per process (``pool_for``)."""

    def setup(self) -> None:
        vocab_info_for(self.vocab)
        pool_for(self.pool)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.concat_tables([self._unit(uid, rows) for uid, rows in by_unit([batch])])

    def _unit(self, uid: str, rows: pa.Table) -> pa.Table:
        ctx, pool, vocab = self.ctx, pool_for(self.pool), vocab_info_for(self.vocab)
        reports = [r for r in rows.column("report").to_pylist() if r is not None]
        rows = rows.filter(pc.invert(pc.is_null(rows.column("id"))))
        ords = rows.column("ord").to_numpy()
        docs = _docs(rows)
        # --mix: a document made c times gets c * dupe_factor passes; copy k's pass p is drawn as pass
        # k * dupe_factor + p (streams of its own) and written with pass p's rows, so every unit keeps dupe_factor
        # passes for the shards.
        copies = rows.column("copies").to_numpy() if "copies" in rows.column_names else np.ones(len(docs), np.int64)
        copies_of_block: list[int] = []
        summary = {"seen": len(docs), "report": json.loads(reports[0]) if reports else None}
        first = int(ords[0]) if len(ords) else 0
        passes = range(ctx.dupe_factor)
        parts: list[list[dict]] = [[] for _ in passes]
        block: list[tuple[str, PackedDoc]] = []
        block_tokens = 0

        def flush() -> None:
            # A pass's rows do not depend on the other passes (each draws from its own stream): one call per pass
            # keeps every pass's rows apart for the shards, at one numpy pass per block and pass.
            for p in passes:
                for k in range(max(copies_of_block)):
                    docs_k = block if k == 0 else [d for d, c in zip(block, copies_of_block, strict=False) if c > k]
                    out = create_instances_flat(docs_k, [k * ctx.dupe_factor + p], ctx.instances, pool, vocab)
                    if out is not None:
                        parts[p].append(out)
            block.clear()
            copies_of_block.clear()

        for doc, c in zip(docs, copies.tolist(), strict=False):
            block.append(doc)
            copies_of_block.append(c)
            block_tokens += len(doc[1].tokens) * c
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
    out: dict = {"seen": sum(x["seen"] for x in summaries)}
    for x in summaries:
        if x["report"] is not None:
            assert "report" not in out, "two report rows for one unit"
            out["report"] = x["report"]
    return out


def write_unit(uid: str, rows: pa.Table, ctx: StepContext, chunks: int, ops: dict | None = None
               ) -> InstancesMarker | UserError:
    """Commit one unit's instance rows (all of them: checked against its report row) as
    ``_work/instances/<uid>.arrow``, each pass's rows cut into ``chunks`` record batches (contiguous, sizes differing
    by at most one row; batch ``p * chunks + c``), what the shards read; then its marker."""
    is_summary = pc.invert(pc.is_null(rows.column("summary")))
    s = _merge([json.loads(x) for x in rows.filter(is_summary).column("summary").to_pylist()])
    report = s.get("report")
    assert report is not None, f"unit {uid}: no report row among its rows"
    if (err := user_error(report)) is not None:
        return err
    assert s["seen"] == report["documents"], (uid, s["seen"], report["documents"])
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
        uid=uid, documents=s["seen"], rows=tuple(rows_per_pass), chunks=chunks, random_next=random_next,
        masked=masked, seq_len_histogram={str(k): int(v) for k, v in sorted(hist.items()) if v},
        masked_per_seq_histogram={str(k): int(v) for k, v in sorted(masked_hist.items())}, ops=ops or {})
    write_marker(ctx.work, marker, ctx.endpoint_url, ctx.fence)
    return marker


@dataclasses.dataclass(frozen=True)
class WriteUnits:
    """The instances pass's sink: each unit's instances committed atomically, then its marker (``write_unit``), so
    a rerun plans only the units without one."""

    ctx: StepContext
    """Where each unit's instances file and marker go."""
    chunks: int = 1
    """Record batches each pass's rows are cut into (``shards.chunks_per_pass``); 1: a pass is one batch."""

    def write(self, tables: list[pa.Table]) -> list[InstancesMarker | UserError]:
        return [write_unit(uid, rows, self.ctx, self.chunks, take_ops()) for uid, rows in by_unit(tables)]


def instances_stage(s: BuildState) -> RowStage:
    assert s.pool is not None, "the instances pass runs after the pool's merge"
    chunks = chunks_per_pass(len(s.units), s.cfg.dupe_factor, s.num_shards)
    return RowStage("instances", s.doc_units, ReadDocs(s.ctx, s.dropped, s.copied),
                    (PairsAndMasks(s.ctx, s.vocab, s.pool),),
                    WriteUnits(s.ctx, chunks), InstancesMarker, s.unit_sizes)
