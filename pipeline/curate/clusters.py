"""The global decisions of deduplication: which documents are copies, and of which document.

- Exact: documents with the same content hash (``pipeline.curate.exact``) form a group; its smallest id is kept,
  every other member is dropped as ``exact_duplicate`` of it.
- Near: verified candidate edges (``verify``: the MinHash estimate of Jaccard >= the threshold, on the whole
  signature) link documents; a connected component keeps its smallest id and drops every other member as
  ``near_duplicate`` of it (union-find with the smaller root winning, so the result is the same for any order of the
  edges). Components are transitive: A ~ B and B ~ C drop B and C even when A and C are further apart, as datatrove
  and NeMo Curator do. ``merge`` makes the drop set: an exact copy of a document that is itself a near duplicate
  points at its cluster's kept id, so every ``duplicate_of`` is a document that stays.

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

from pipeline.curate.contract import DUPLICATE_SCHEMA, EXACT, NEAR
from pipeline.curate.minhash import agreement


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
    component but its smallest id, as ``near_duplicate`` of that id."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        r = x
        while (p := parent.get(r, r)) != r:
            r = p
        while x != r:  # path compression
            parent[x], x = r, parent[x]
        return r

    for a, b in edges:
        for x, y in zip(a.to_pylist(), b.to_pylist()):
            rx, ry = root(x), root(y)
            if rx != ry:
                lo, hi = (rx, ry) if rx < ry else (ry, rx)
                parent[hi] = lo
    dropped = sorted(x for x in parent if root(x) != x)
    return pa.table({"id": pa.array(dropped, pa.string()), "reason": pa.array([NEAR] * len(dropped), pa.string()),
                     "duplicate_of": pa.array([root(x) for x in dropped], pa.string())}, schema=DUPLICATE_SCHEMA)


def merge(exact: pa.Table, near: pa.Table) -> pa.Table:
    """The drop set: exact and near rows, in id order, every ``duplicate_of`` a kept document. An exact copy of a
    document that is itself a near duplicate points at that cluster's kept id (its reason stays
    ``exact_duplicate``: its text equals a dropped document's)."""
    root = dict(zip(near["id"].to_pylist(), near["duplicate_of"].to_pylist()))
    if root and len(exact):
        kept = [root.get(d, d) for d in exact["duplicate_of"].to_pylist()]
        exact = exact.set_column(2, "duplicate_of", pa.array(kept, pa.string()))
    return sort_drops(pa.concat_tables([exact.cast(DUPLICATE_SCHEMA), near.cast(DUPLICATE_SCHEMA)]))


def sort_drops(table: pa.Table) -> pa.Table:
    """A drop table in one canonical order (by id bytes), so two runs compare byte for byte."""
    if not len(table):
        return table.cast(DUPLICATE_SCHEMA)
    return table.sort_by("id").cast(DUPLICATE_SCHEMA).combine_chunks()
