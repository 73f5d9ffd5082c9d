"""LSH banding of MinHash signatures: which bands and rows for a threshold, band keys, and candidate edges.

Two documents become candidates when all ``rows`` values of any one of ``bands`` bands of their signatures agree:
probability ``1 - (1 - J**rows)**bands`` for Jaccard J. ``banding`` picks (bands, rows) for a threshold: among the
bandings that fit in ``num_perm``, those that catch a pair sitting exactly at the threshold with probability >= 0.9,
and of those the one that makes the fewest candidates below it (the integral of the curve from 0 to the threshold).
Candidates are then verified on the whole signature (``curate.clusters``), so false candidates cost time,
not correctness. At the default threshold 0.65 with 112 permutations that is 19 bands of 5 rows: 0.90 at
J = 0.65, 0.97 at 0.7, 0.9995 at 0.8, 0.45 at 0.5 (at 0.8: 13 x 8; datatrove and FineWeb use 14 x 8 at 0.75-0.8,
with no verification).

A bucket is the documents sharing one band key. ``bucket_edges`` turns a set of (key, id, exact hash) rows into
edges that connect every bucket: within a bucket, exact copies (same content hash) collapse to their smallest id
(exact copies have equal signatures, so a bucket holds all of them or none), and each remaining document is joined
to the bucket's smallest id: a star of k - 1 edges rather than k(k - 1)/2 pairs. Edges depend only on which rows
exist, never on their order or batching.
"""
from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus.rng import mix64

MIN_CATCH = 0.9  # P(candidate) a pair exactly at the threshold must have


def candidate_probability(similarity: float | np.ndarray, bands: int, rows: int):
    return 1.0 - (1.0 - np.asarray(similarity, dtype=np.float64) ** rows) ** bands


@functools.lru_cache(maxsize=32)
def banding(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows) for ``threshold`` within ``num_perm`` permutations (module docstring); ValueError when none
    catches a pair at the threshold often enough."""
    below = np.linspace(0.0, threshold, 401)
    best: tuple[float, int, int] | None = None
    for rows in range(1, num_perm + 1):
        bands = num_perm // rows
        if candidate_probability(threshold, bands, rows) < MIN_CATCH:
            continue
        # fewest candidates below the threshold; with the same, fewer bands (fewer rows to shuffle)
        for b in range(1, bands + 1):
            if candidate_probability(threshold, b, rows) < MIN_CATCH:
                continue
            false = float(np.trapezoid(candidate_probability(below, b, rows), below))
            if best is None or (false, b) < (best[0], best[1]):
                best = (false, b, rows)
            break  # more bands only add candidates
    if best is None:
        raise ValueError(f"no LSH banding of {num_perm} permutations finds pairs at Jaccard {threshold}: raise the"
                         " number of permutations or the threshold")
    return best[1], best[2]


def band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(documents x bands) uint64 keys: a hash of the band's index and its ``rows`` signature values, so equal
    values in different bands never share a bucket."""
    n = len(sigs)
    keys = np.empty((n, bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for b in range(bands):
            h = np.full(n, np.uint64(b + 1) * np.uint64(0x9E3779B97F4A7C15), dtype=np.uint64)
            for v in sigs[:, b * rows:(b + 1) * rows].T:
                h = mix64(h ^ v.astype(np.uint64))
            keys[:, b] = h
    return keys


def bucket_edges(key: np.ndarray, ids: pa.Array, content: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Candidate edges (a, b), a < b, deduplicated, from rows of (band key, document id, content hash): the stars of
    the module docstring. Every row of a bucket must be present (a whole partition of the band shuffle)."""
    if not len(key):
        empty = pa.array([], pa.string())
        return empty, empty
    t = pa.table({"key": pa.array(key, pa.uint64()), "id": ids, "content": content})
    # The smallest id per (bucket, content): exact copies collapse to one representative.
    reps = t.group_by(["key", "content"], use_threads=False).aggregate([("id", "min")])
    # Buckets with more than one representative make edges to their smallest representative.
    heads = reps.group_by("key", use_threads=False).aggregate([("id_min", "min"), ("id_min", "count")])
    heads = heads.filter(pc.greater(heads["id_min_count"], 1))
    if not len(heads):
        empty = pa.array([], pa.string())
        return empty, empty
    joined = reps.join(heads.select(["key", "id_min_min"]), "key", join_type="inner", use_threads=False)
    joined = joined.filter(pc.not_equal(joined["id_min"], joined["id_min_min"]))
    edges = pa.table({"a": joined["id_min_min"], "b": joined["id_min"]})
    edges = edges.group_by(["a", "b"], use_threads=False).aggregate([])
    return edges["a"].combine_chunks(), edges["b"].combine_chunks()
