"""The global deduplication decision on Ray Data: signatures in, drop set out, memory bounded by partition.

The same computation as the plain loop (``curate.dedup.drop_set``), through Ray Data shuffles instead of
one process's memory; no signature passes through the driver:

    signatures (id, content, sig), materialized once in the object store (spilled to disk when it is full)
    exact   rows keyed by content hash     -> groupby(part) -> exact_groups        -> exact drop rows
    bands   a row per (document, band)     -> groupby(part) -> bucket_edges        -> candidate edges (a, b)
    attach  edges keyed by a + signatures  -> groupby(part) -> a's signature onto each edge
    verify  those keyed by b + signatures  -> groupby(part) -> verify              -> near-duplicate edges
    one task: components(edges) + the exact drops -> the drop set (an object in the store, O(duplicates))

Each shuffle groups rows by ``part``, a hash of their key modulo the number of partitions, so a group is a whole
partition: every row of a bucket, content hash or document lands in the same call. The number of partitions follows
the rows' size (``partition_bytes`` of rows each, 32 MB by default), and the rows are cut into that many blocks
before the shuffle (a sort-based shuffle makes as many output blocks as it has input blocks), so each call is meant
to hold about one partition whatever the corpus size: measured, a worker's private memory stays ~0.5-0.6 GB from 51
to 514 MB of input (docs/benchmarks.md, "Curation cost"). What grows with the corpus is the object store: the
materialized signatures and each shuffle's blocks (O(documents x bands) rows), one copy per node, spilled to disk
beyond the store's size; the verification shuffles' rows carry signatures as variable-width binary so that an edge
row's null signature costs an offset, not 4 x num_perm bytes (``_keyed``). Groups are
processed with Arrow/NumPy, not a call per key. Shuffles are Ray Data's sort-based ones: in Ray 2.60 the default
hash shuffle starts its aggregator actors for every shuffle (~5 s each on a 2-CPU box against ~0.3 s sorted).
"""
from __future__ import annotations

import contextlib
import hashlib
import math
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from curate.clusters import components, exact_groups, merge
from curate.contract import DUPLICATE_SCHEMA
from curate.dedup import DedupConfig, Signatures, band_rows, sig_matrix, signature_schema, verified
from curate.lsh import bucket_edges

PARTITION_BYTES = 32 << 20  # rows per shuffle partition: one call's input (its temporaries are a few times that)
_ID_BYTES = 48  # a row's id and Arrow offsets, as an estimate


def signature_row_bytes(cfg: DedupConfig) -> int:
    """A signature row's bytes in the shuffles that hold signatures (part, id, content hash, MinHash)."""
    return 8 + _ID_BYTES + 16 + (4 * cfg.num_perm if cfg.mode == "near" else 0)


def partitions(num_docs: int, row_bytes: int, partition_bytes: int = PARTITION_BYTES) -> int:
    return max(1, math.ceil(num_docs * row_bytes / partition_bytes))


def _shuffled(ds, parts: int, fn, **kw):
    """``ds`` grouped by ``part`` through a sort-based shuffle with ``parts`` output blocks, ``fn`` per group."""
    return ds.repartition(parts).groupby("part").map_groups(fn, batch_format="pyarrow", **kw)


def _part_of_ids(ids: pa.Array, parts: int) -> pa.Array:
    return pa.array([int.from_bytes(hashlib.blake2b(i.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                                    "little") % parts for i in ids.to_pylist()], pa.uint64())


def _part_of_content(content: pa.Array, parts: int) -> pa.Array:
    return pa.array([int.from_bytes(c[:8], "little") % parts for c in content.to_pylist()], pa.uint64())


SHUFFLE_SIG = pa.binary()  # a signature in the verification shuffles: variable width, so a null costs an offset


def _keyed(key: pa.Array, other: pa.Array | None, sig: pa.Array | None, parts: int):
    """Rows of the verification shuffles. ``sig`` is variable-width binary there, not the signatures' fixed-size
    binary: an edge row carries no signature, and a fixed-size null still holds its 4 x num_perm bytes (448 at the
    defaults), which made the edge rows, up to one per band per duplicate, most of the object store's bytes."""
    n = len(key)
    return pa.table({"part": _part_of_ids(key, parts), "key": key,
                     "other": other if other is not None else pa.nulls(n, pa.string()),
                     "sig": sig.cast(SHUFFLE_SIG) if sig is not None else pa.nulls(n, SHUFFLE_SIG)})


class _ExactPart:
    def __init__(self, parts: int):
        self.parts = parts

    def __call__(self, t: pa.Table) -> pa.Table:
        return t.select(["id", "content"]).append_column("part", _part_of_content(t["content"], self.parts))


def _exact(group: pa.Table) -> pa.Table:
    return exact_groups(group["id"], group["content"])


class _BandPart:
    def __init__(self, cfg: DedupConfig, parts: int):
        self.cfg, self.parts = cfg, parts

    def __call__(self, t: pa.Table) -> pa.Table:
        rows = band_rows(t, self.cfg)
        part = pa.array(rows["key"].to_numpy() % np.uint64(self.parts), pa.uint64())
        return rows.append_column("part", part)


def _edges(group: pa.Table) -> pa.Table:
    a, b = bucket_edges(group["key"].to_numpy(), group["id"], group["content"])
    return pa.table({"a": a, "b": b})


class _Keyed:
    """Rows of one shape for the two verification shuffles: (part, key, other, sig)."""

    def __init__(self, kind: str, parts: int):
        self.kind, self.parts = kind, parts

    def __call__(self, t: pa.Table) -> pa.Table:
        if self.kind == "edges":  # keyed by a, the other end b
            return _keyed(t["a"], t["b"], None, self.parts)
        return _keyed(t["id"], None, t["sig"], self.parts)


def _own_sigs(group: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(the group's signature rows as key -> sig, its other rows)."""
    is_sig = group["other"].is_null()
    return group.filter(is_sig), group.filter(pc.invert(is_sig))


def _attach(group: pa.Table, parts: int | None) -> pa.Table:
    """Edges keyed by a get a's signature and are keyed by b (``part`` 0 when ``parts`` is None: the next
    shuffle's partitions are set once the attached edges are counted, ``_Rekeyed``)."""
    sigs, edges = _own_sigs(group)
    # An edge found in several bands arrives once per band: one is enough.
    edges = edges.group_by(["key", "other"], use_threads=False).aggregate([])
    at = pc.index_in(edges["key"], value_set=sigs["key"])
    # (b, a, sig_a): keyed by b for the next shuffle.
    return _keyed(edges["other"], edges["key"], sigs["sig"].take(at), parts or 1)


class _Rekeyed:
    def __init__(self, parts: int):
        self.parts = parts

    def __call__(self, t: pa.Table) -> pa.Table:
        return t.set_column(0, "part", _part_of_ids(t["key"], self.parts))


def _verify(group: pa.Table, cfg: DedupConfig) -> pa.Table:
    sigs, edges = _own_sigs(group)
    at = pc.index_in(edges["key"], value_set=sigs["key"])
    fixed = signature_schema(cfg).field("sig").type
    sig_b = sig_matrix(sigs["sig"].take(at).cast(fixed), cfg.num_perm)
    sig_a = sig_matrix(edges["sig"].cast(fixed), cfg.num_perm)
    a, b = verified(edges["other"].combine_chunks(), edges["key"].combine_chunks(), sig_a, sig_b, cfg)
    return pa.table({"a": a, "b": b})


def _decide(exact: list, edges: list) -> pa.Table:
    exact_tables = ray.get(exact) if exact else []
    edge_tables = ray.get(edges) if edges else []
    near = components((t["a"].combine_chunks(), t["b"].combine_chunks()) for t in edge_tables if len(t))
    return merge(pa.concat_tables([DUPLICATE_SCHEMA.empty_table()] + [t.cast(DUPLICATE_SCHEMA) for t in exact_tables]),
                 near)


@contextlib.contextmanager
def _data_context(num_cpus: int | None, ds: ray.data.Dataset):
    """Sort-based shuffles (and the CPU cap) for this computation. A Dataset keeps the context it was created with
    (its derived Datasets share that object), so the caller's Dataset's context is set too, then restored: setting
    only the current one left the caller's Dataset on Ray's hash shuffle (200 aggregator partitions, a worker process
    started for many of them: ~30 CPU-s per run on a 2-CPU box, whatever the input size)."""
    contexts = [ray.data.DataContext.get_current()]
    if ds.context is not contexts[0]:
        contexts.append(ds.context)
    saved = [(c.shuffle_strategy, c.execution_options.resource_limits) for c in contexts]
    for c in contexts:
        c.shuffle_strategy = ray.data.context.ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
        if num_cpus:
            c.execution_options.resource_limits = c.execution_options.resource_limits.copy(cpu=num_cpus)
    try:
        yield
    finally:
        for c, (strategy, limits) in zip(contexts, saved, strict=False):
            c.shuffle_strategy, c.execution_options.resource_limits = strategy, limits


def signatures(documents: ray.data.Dataset, cfg: DedupConfig) -> ray.data.Dataset:
    """The per-document signature operator over a Dataset of documents (``contract``'s columns)."""
    return documents.map_batches(Signatures(cfg), batch_format="pyarrow", zero_copy_batch=True)


def drop_set_ref(sigs: ray.data.Dataset, cfg: DedupConfig, num_cpus: int | None = None,
                 partition_bytes: int = PARTITION_BYTES) -> ray.ObjectRef:
    """The drop set of the signatures' documents, as an object in Ray's store (the filter's workers read it from
    there; the driver never holds it)."""
    if cfg.mode == "off":
        return ray.put(DUPLICATE_SCHEMA.empty_table())
    with _data_context(num_cpus, sigs):
        sigs = sigs.materialize()
        n = sigs.count()
        row = 8 + _ID_BYTES + 16  # part, id, content
        parts = partitions(n, row, partition_bytes)
        exact = _shuffled(sigs.map_batches(_ExactPart(parts), batch_format="pyarrow"), parts, _exact).materialize()
        edge_refs = []
        if cfg.mode == "near":
            sig_row = row + 8 + 4 * cfg.num_perm  # (an offset and the signature's bytes)
            band_parts = partitions(n * cfg.bands, row + 8, partition_bytes)
            edges = _shuffled(sigs.map_batches(_BandPart(cfg, band_parts), batch_format="pyarrow"), band_parts,
                              _edges).materialize()
            # The next two shuffles hold every signature and the edges: sized by both (edges come once per band
            # that found them, so a corpus of many copies has many more edge rows than documents).
            parts = partitions(1, n * sig_row + edges.count() * (row + 8), partition_bytes)
            attached = _shuffled(edges.map_batches(_Keyed("edges", parts), batch_format="pyarrow")
                                 .union(sigs.map_batches(_Keyed("sigs", parts), batch_format="pyarrow")),
                                 parts, partial(_attach, parts=None)).materialize()
            parts = partitions(1, (n + attached.count()) * sig_row, partition_bytes)
            near = _shuffled(attached.map_batches(_Rekeyed(parts), batch_format="pyarrow")
                             .union(sigs.map_batches(_Keyed("sigs", parts), batch_format="pyarrow")),
                             parts, partial(_verify, cfg=cfg)).materialize()
            edge_refs = near.to_arrow_refs()
        return ray.remote(_decide).options(num_cpus=1).remote(exact.to_arrow_refs(), edge_refs)


def drop_set(sigs: ray.data.Dataset, cfg: DedupConfig, num_cpus: int | None = None,
             partition_bytes: int = PARTITION_BYTES) -> pa.Table:
    """``drop_set_ref`` fetched: for tests and small corpora (a build keeps the reference)."""
    return ray.get(drop_set_ref(sigs, cfg, num_cpus, partition_bytes))
