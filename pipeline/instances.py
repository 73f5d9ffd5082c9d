"""The instances pass: how many rows each (document, pass) makes, never the rows. A row pipeline (``rows.py``):

    ReadDocs -> CountPairs -> WriteCounts
                each unit's rows per (document copy, pass) as _work/counts/<uid>.arrow, then its InstancesMarker
                (rows per pass: where each pass's rows sit in the shards' global order)

Instance generation is a pure function of a document, its pass, the seed and the random-next pool (every random
decision of a document pass comes from its own stream: ``corpus.create_instances``). So this pass only walks each
document pass's chunks (``count_pairs``: the first uniforms of its stream, no tokens, pairs or masks), and each shard
item makes the NSP pairs and MLM masks of exactly the rows its slices cover (``unit_rows``), from the tokenized
documents the read pass left in _work, straight into its Parquet file: no instance is written to _work and read
back. A document pass is made in full once, plus once more where a slice boundary cuts it (docs/architecture.md,
"No instance round trip").

A unit's rows in pass ``p`` are in the order of its *document copies*: copy ``k`` of every document made at least
``k + 1`` times (``--mix``), ``k`` = 0, 1, ..., documents in order within a copy; copy ``k``'s pass ``p`` is drawn as
pass ``k * dupe_factor + p`` (streams of its own).
"""
from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus.create_instances import RandomDocPool, count_pairs, create_instances_flat
from corpus.pairs import PackedDoc
from corpus.readers import Unit
from corpus.schema import token_dtype, work_instance_schema
from pipeline.docs import doc_arrays, docs_url
from pipeline.drops import copies_of, kept
from pipeline.markers import Marker, marker, write_marker
from pipeline.rows import RowStage, UserError, by_unit, take_ops, user_error
from pipeline.sizes import chunks_per_pass
from pipeline.state import BuildState
from pipeline.work import WORK_SUFFIX, StepContext, read_table, write_table

log = logging.getLogger(__name__)

LIST_COLUMNS = ("input_ids", "masked_lm_positions", "masked_lm_ids")

_INSTANCE_BLOCK_TOKENS = 1 << 20  # document tokens per call of create_instances_flat (~10 bytes each while masking)


@marker("instances")
class InstancesMarker(Marker):
    """A unit's row counts: ``rows[p]`` rows in pass ``p`` (the documents they come from are counted by the read
    pass's marker); its rows per document copy and pass are in ``_work/counts/<uid>.arrow``."""

    uid: str
    """The unit's id: the marker's key."""
    documents: int
    """Documents the pass counted rows of: the unit's tokenized documents less what drop lists removed."""
    rows: tuple[int, ...]
    """Instance rows per pass (``dupe_factor`` entries): where each pass's rows sit in the shards' global order."""
    cuts: tuple[tuple[int, ...], ...] = ()
    """Per pass, the rows where its chunks start, then ``rows[p]`` (``sizes.chunks_per_pass`` chunks): the pieces of
    the global order (shards.py), cut at the document copy boundary nearest to an even split, so that only a
    shard's own boundaries cut a document pass."""
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


def _docs(rows: pa.Table) -> list[tuple[str, PackedDoc]]:
    """The documents of ReadDocs's rows as (id, PackedDoc) views of one flat array."""
    ids, outer, inner, flat = doc_arrays(rows, "id")
    inner = inner.astype(np.int64)
    docs = []
    for i, d in enumerate(ids):
        s0, s1 = outer[i], outer[i + 1]
        docs.append((d, PackedDoc(flat[inner[s0]:inner[s1]], inner[s0:s1 + 1] - inner[s0])))
    return docs


def _copies(rows: pa.Table, n: int) -> np.ndarray:
    return rows.column("copies").to_numpy() if "copies" in rows.column_names else np.ones(n, np.int64)


@dataclasses.dataclass(frozen=True)
class CountPairs:
    """Documents -> rows per (document, copy, pass), one output row per document (``unit``, ``ord``, ``copies``,
    ``rows``: copy-major, then pass) and per unit and batch one summary row (``summary``: the documents seen, the
    report row's content) that the sink turns into the unit's marker."""

    ctx: StepContext
    """The instance settings and the passes (``dupe_factor``)."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.concat_tables([self._unit(uid, rows) for uid, rows in by_unit([batch])])

    def _unit(self, uid: str, rows: pa.Table) -> pa.Table:
        ctx = self.ctx
        reports = [r for r in rows.column("report").to_pylist() if r is not None]
        rows = rows.filter(pc.invert(pc.is_null(rows.column("id"))))
        docs = _docs(rows)
        copies = _copies(rows, len(docs))
        d = ctx.dupe_factor
        base = count_pairs(docs, range(d), ctx.instances)  # copy 0 of every document
        counts = [np.concatenate([base[i], count_pairs([docs[i]], range(d, c * d), ctx.instances)[0]])
                  if c > 1 else base[i] for i, c in enumerate(copies.tolist())]
        summary = {"seen": len(docs), "report": json.loads(reports[0]) if reports else None}
        n = len(docs)
        return pa.table({
            "unit": pa.array([uid] * (n + 1), pa.string()),
            "ord": pa.array(np.append(rows.column("ord").to_numpy(), -1).astype(np.int64)),
            "copies": pa.array(np.append(copies, 0).astype(np.int64)),
            "rows": pa.array([c.tolist() for c in counts] + [None], pa.list_(pa.int64())),
            "summary": pa.array([None] * n + [json.dumps(summary, sort_keys=True)], pa.string())})


def counts_url(ctx: StepContext, uid: str) -> str:
    return ctx.url("counts", uid + WORK_SUFFIX)


def _merge(summaries: list[dict]) -> dict:
    """One unit's summary rows (one per batch it was made in) as one."""
    out: dict = {"seen": sum(x["seen"] for x in summaries)}
    for x in summaries:
        if x["report"] is not None:
            assert "report" not in out, "two report rows for one unit"
            out["report"] = x["report"]
    return out


def doc_cuts(starts: np.ndarray, chunks: int) -> tuple[int, ...]:
    """``chunks`` pieces of a pass whose document copies start at ``starts`` (then its rows): each cut at the copy
    start nearest to the even split ``c * rows // chunks`` (pieces may be empty)."""
    n = int(starts[-1])
    out = [0]
    for c in range(1, chunks):
        t = c * n // chunks
        i = int(np.searchsorted(starts, t))  # starts[i] >= t > starts[i - 1]; i <= len(starts) - 1 as t < n
        above, below = int(starts[i]), int(starts[max(i - 1, 0)])
        out.append(max(above if above - t <= t - below else below, out[-1]))
    return tuple(out + [n])


def write_unit(uid: str, rows: pa.Table, ctx: StepContext, chunks: int = 1, ops: dict | None = None
               ) -> InstancesMarker | UserError:
    """Commit one unit's row counts (all its documents: checked against its report row) as
    ``_work/counts/<uid>.arrow``, one column per pass and one row per document copy (copy-major); then its marker."""
    is_summary = pc.invert(pc.is_null(rows.column("summary")))
    s = _merge([json.loads(x) for x in rows.filter(is_summary).column("summary").to_pylist()])
    report = s.get("report")
    assert report is not None, f"unit {uid}: no report row among its rows"
    if (err := user_error(report)) is not None:
        return err
    assert s["seen"] == report["documents"], (uid, s["seen"], report["documents"])
    docs = rows.filter(pc.invert(is_summary))
    docs = docs.take(pa.array(np.argsort(docs.column("ord").to_numpy(), kind="stable")))
    d = ctx.dupe_factor
    copies = docs.column("copies").to_numpy()
    flat = docs.column("rows").combine_chunks() if docs.num_rows else pa.array([], pa.list_(pa.int64()))
    per_doc = np.asarray(flat.values.to_numpy() if len(flat) else np.zeros(0, np.int64), np.int64)
    starts = flat.offsets.to_numpy()[:-1] if len(flat) else np.zeros(0, np.int64)
    table = [per_doc[starts[copies > k] + k * d + p] for k in range(int(copies.max(initial=1)))
             for p in range(d)]  # [k * d + p]: copy k's rows in pass p, of its documents in order
    by_pass = np.stack([np.concatenate([table[k * d + p] for k in range(len(table) // d)]) for p in range(d)])
    write_table(counts_url(ctx, uid), pa.table({f"p{p}": pa.array(by_pass[p].astype(np.int32)) for p in range(d)}),
                ctx)
    starts = np.zeros((d, by_pass.shape[1] + 1), np.int64)
    np.cumsum(by_pass, axis=1, out=starts[:, 1:])
    marker = InstancesMarker(uid=uid, documents=s["seen"], rows=tuple(int(x) for x in starts[:, -1]),
                             cuts=tuple(doc_cuts(starts[p], chunks) for p in range(d)), ops=ops or {})
    write_marker(ctx.work, marker, ctx.endpoint_url, ctx.fence)
    return marker


@dataclasses.dataclass(frozen=True)
class WriteCounts:
    """The instances pass's sink: each unit's row counts committed atomically, then its marker (``write_unit``), so
    a rerun plans only the units without one."""

    ctx: StepContext
    """Where each unit's counts file and marker go."""
    chunks: int = 1
    """Pieces each pass's rows are cut into for the global order (``sizes.chunks_per_pass``)."""

    def write(self, tables: list[pa.Table]) -> list[InstancesMarker | UserError]:
        return [write_unit(uid, rows, self.ctx, self.chunks, take_ops()) for uid, rows in by_unit(tables)]


def instances_stage(s: BuildState) -> RowStage:
    chunks = chunks_per_pass(len(s.units), s.cfg.dupe_factor, s.num_shards)
    return RowStage("instances", s.doc_units, ReadDocs(s.ctx, s.dropped, s.copied), (CountPairs(s.ctx),),
                    WriteCounts(s.ctx, chunks), InstancesMarker, s.unit_sizes)


# --- the shard items' side: a unit's rows, made again from its documents (shards.py).

@dataclasses.dataclass(frozen=True)
class UnitDocs:
    """A unit's documents as the shards make its rows: each document copy (copy-major) and its rows per pass."""

    docs: list
    """(id, PackedDoc) of the unit's documents, in order."""
    doc: np.ndarray
    """Per document copy: its document's index in ``docs``."""
    copy: np.ndarray
    """Per document copy: which copy (0 for the first), its passes drawn as ``copy * dupe_factor + pass``."""
    starts: np.ndarray
    """(passes, copies + 1): the first row of each document copy in its pass's rows, then the pass's rows."""
    nbytes: int = 0
    """The memory it holds (the flat token array its documents are views of, the offsets): what a cache counts."""


def load_unit(unit: Unit, ctx: StepContext, dropped: frozenset[str], copied: frozenset[str]) -> UnitDocs:
    """What the read pass committed of ``unit`` (less its drop list) and the instances pass's counts."""
    rows = ReadDocs(ctx, dropped, copied)(unit)
    rows = rows.slice(0, rows.num_rows - 1)  # the documents, without the report row ReadDocs ends with (no copy)
    assert rows.column("id").null_count == 0, unit.uid
    docs = _docs(rows)
    copies = _copies(rows, len(docs))
    ks = [np.flatnonzero(copies > k) for k in range(int(copies.max(initial=1)))]
    counts = read_table(counts_url(ctx, unit.uid), ctx)
    assert counts.num_rows == sum(len(k) for k in ks), (unit.uid, counts.num_rows, sum(len(k) for k in ks))
    starts = np.zeros((ctx.dupe_factor, sum(len(k) for k in ks) + 1), np.int64)
    for p in range(ctx.dupe_factor):
        np.cumsum(counts.column(f"p{p}").to_numpy(), out=starts[p, 1:])
    nbytes = sum(c.nbytes for c in rows.column("sentences").chunks) + starts.nbytes
    return UnitDocs(docs, np.concatenate(ks) if ks else np.zeros(0, np.int64),
                    np.concatenate([np.full(len(x), k) for k, x in enumerate(ks)]) if ks else np.zeros(0, np.int64),
                    starts, nbytes)


def unit_rows(u: UnitDocs, p: int, lo: int, hi: int, ctx: StepContext, pool: RandomDocPool, vocab
              ) -> tuple[pa.Table, int]:
    """Rows [lo, hi) of pass ``p`` of the unit: the pairs and masks of only the document copies they come from
    (``create_instances_flat``, a block of documents at a time), as the _work instance schema; and the rows made
    (those of the first and last document copy outside [lo, hi) included: what a slice boundary costs)."""
    starts = u.starts[p]
    first = int(np.searchsorted(starts, lo, side="right")) - 1
    last = int(np.searchsorted(starts, hi, side="left"))  # copies [first, last) hold rows [lo, hi)
    parts: list[dict] = []
    block: list = []
    block_tokens, block_copy = 0, -1

    def flush() -> None:
        if block:
            out = create_instances_flat(block, [block_copy * ctx.dupe_factor + p], ctx.instances, pool, vocab)
            if out is not None:
                parts.append(out)
            block.clear()

    for j in range(first, last):
        k = int(u.copy[j])
        doc = u.docs[int(u.doc[j])]
        if k != block_copy or block_tokens >= _INSTANCE_BLOCK_TOKENS:
            flush()
            block_copy, block_tokens = k, 0
        block.append(doc)
        block_tokens += len(doc[1].tokens)
    flush()
    table = _table(parts, ctx.vocab_size)
    assert table.num_rows == starts[last] - starts[first], (table.num_rows, starts[last] - starts[first])
    return table.slice(lo - int(starts[first]), hi - lo), table.num_rows
