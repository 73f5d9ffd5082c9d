"""The global decisions of deduplication: which documents are copies, and of which document.

- Exact: documents with the same content hash (``curate.exact``) form a group; its smallest id is kept,
  every other member is dropped as ``exact_duplicate`` of it.
- Near: verified candidate edges (``verify``: the MinHash estimate of Jaccard >= the threshold, on the whole
  signature) link documents; a connected component keeps its smallest id and drops every other member as
  ``near_duplicate`` of it (the smallest id reached, propagated to a fixed point, so the result is the same for any
  order of the edges). Components are transitive: A ~ B and B ~ C drop B and C even when A and C are further apart,
  as datatrove and NeMo Curator do. ``merge`` makes the drop set: an exact copy of a document that is itself a near
  duplicate points at its cluster's kept id, so every ``duplicate_of`` is a document that stays.

"Smallest" is the order of the ids' code points (the order of their UTF-8 bytes: Arrow's and Python's agree).
Both decisions depend only on the set of documents, never on how they were batched, ordered or spread over workers,
so the drop set is identical at any number of CPUs or nodes. Memory: the edges and the drop set, O(duplicates),
not O(corpus).
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curate.contract import DUPLICATE_SCHEMA, EXACT, NEAR
from curate.minhash import agreement


def exact_groups(ids: pa.Array, content: pa.Array) -> pa.Table:
    """Drop rows (``DUPLICATE_SCHEMA``) for every document whose content hash an earlier (smaller) id holds. Every
    row of a content hash must be present (a whole partition of the hash shuffle)."""
    t = pa.table({"id": ids, "content": content})
    heads = t.group_by("content", use_threads=False).aggregate([("id", "min")])
    joined = t.join(heads, "content", join_type="inner", use_threads=False)
    dup = joined.filter(pc.not_equal(joined["id"], joined["id_min"]))
    return pa.table({"id": dup["id"], "reason": pa.array([EXACT] * len(dup), pa.string()),
                     "duplicate_of": dup["id_min"]}, schema=DUPLICATE_SCHEMA)


def verify(sig_a: np.ndarray, sig_b: np.ndarray, threshold: float) -> np.ndarray:
    """Which candidate pairs are near duplicates: signature agreement >= threshold (a bool per pair)."""
    return agreement(sig_a, sig_b) >= threshold


def components(edges: Iterable[tuple[pa.Array, pa.Array]]) -> pa.Table:
    """Near-duplicate drop rows from verified edges (batches of (a, b) id arrays): every member of a connected
    component but its smallest id, as ``near_duplicate`` of that id.

    In Arrow and NumPy, not Python objects per id (the deciding task holds every edge of the corpus): the ids are
    numbered by their order (so the smallest number is the smallest id), then each node's label, the smallest number
    it is linked to, is propagated along the edges and through the labels (pointer jumping) until nothing changes."""
    pairs = [(pa.array(a) if not isinstance(a, pa.Array) else a, pa.array(b) if not isinstance(b, pa.Array) else b)
             for a, b in edges]
    pairs = [(a.cast(pa.string()), b.cast(pa.string())) for a, b in pairs if len(a)]
    if not pairs:
        return DUPLICATE_SCHEMA.empty_table()
    ends = pa.chunked_array([a for a, _ in pairs] + [b for _, b in pairs]).combine_chunks()
    names = pc.unique(ends)
    names = names.take(pc.sort_indices(names))  # code-point order (UTF-8 bytes): number k is the k-th smallest id
    node = pc.index_in(ends, value_set=names).to_numpy().astype(np.int64)
    n_edges = len(node) // 2
    u, v = node[:n_edges], node[n_edges:]
    label = np.arange(len(names), dtype=np.int64)
    while True:
        low = np.minimum(label[u], label[v])
        new = label.copy()
        np.minimum.at(new, u, low)
        np.minimum.at(new, v, low)
        while True:  # pointer jumping: a label's own label, until each points at a root
            jumped = new[new]
            if np.array_equal(jumped, new):
                break
            new = jumped
        if np.array_equal(new, label):
            break
        label = new
    dropped = np.flatnonzero(label != np.arange(len(names)))
    return pa.table({"id": names.take(pa.array(dropped)), "reason": pa.array([NEAR] * len(dropped), pa.string()),
                     "duplicate_of": names.take(pa.array(label[dropped]))}, schema=DUPLICATE_SCHEMA)


def merge(exact: pa.Table, near: pa.Table) -> pa.Table:
    """The drop set: exact and near rows, in id order, every ``duplicate_of`` a kept document. An exact copy of a
    document that is itself a near duplicate points at that cluster's kept id (its reason stays
    ``exact_duplicate``: its text equals a dropped document's)."""
    exact = exact.cast(DUPLICATE_SCHEMA)
    if len(near) and len(exact):
        at = pc.index_in(exact["duplicate_of"], value_set=near["id"])
        kept = pc.if_else(at.is_valid(), near["duplicate_of"].take(at), exact["duplicate_of"])
        exact = exact.set_column(2, "duplicate_of", kept)
    return sort_drops(pa.concat_tables([exact, near.cast(DUPLICATE_SCHEMA)]))


def sort_drops(table: pa.Table) -> pa.Table:
    """A drop table in one canonical order (by id bytes), so two runs compare byte for byte."""
    if not len(table):
        return table.cast(DUPLICATE_SCHEMA)
    return table.sort_by("id").cast(DUPLICATE_SCHEMA).combine_chunks()
