"""Global deduplication as three parts the build runs at three places, and its config.

1. ``Signatures`` (per document, in the read pass): id -> content hash and, for ``near``, a MinHash signature.
2. The global decision over every signature of the corpus -> the drop set (``DUPLICATE_SCHEMA``: id, reason,
   duplicate_of). ``drop_set`` here is the plain loop (every signature in this process: small corpora, tests,
   debugging); ``curate.ray_dedup.drop_set`` is the same computation on Ray Data with memory bounded by
   partition. Both call the same functions (``clusters``, ``lsh``), so they give the same drop set.
3. ``ApplyDrops`` (a filter, in the pass that reads the documents again): drops what the drop set names.

``--dedup off`` (the default) keeps every document, as the reference does; ``exact`` drops byte copies (after
whitespace normalisation); ``near`` drops those and documents whose word shingles overlap another's by Jaccard >=
``threshold`` (MinHash + LSH, candidates verified on the whole signature). In ``near`` a copy is reported as
``exact_duplicate`` when its text equals a smaller id's, else ``near_duplicate``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus.rng import DEFAULT_SEED
from curate import contract
from curate.clusters import components, exact_groups, merge, verify
from curate.exact import CONTENT_TYPE, content_hashes
from curate.lsh import band_keys, banding, bucket_edges
from curate.minhash import signatures
from curate.words import words

MODES = ("off", "exact", "near")


@dataclasses.dataclass(frozen=True)
class DedupConfig:
    """``mode``: off | exact | near. Near: Jaccard ``threshold`` on sets of ``shingle_words``-word shingles
    (0.65 on 4-word shingles, chosen from the measured curve of recall and false drops against edit level,
    ``benchmarks/curate_near_curve.py`` and docs/build-checks.md: the common 0.8 on 5-word shingles misses most
    copies with 3% of the words edited), ``num_perm`` MinHash permutations (112: a standard error of 0.045 at
    J = 0.65), LSH bands and rows derived from the threshold (``curate.lsh.banding``: 19 x 5 at the defaults),
    permutations seeded from ``seed``."""

    mode: str = "off"
    """off | exact | near; off keeps every document, as the reference does."""
    threshold: float = 0.65
    """Jaccard similarity of two documents' word-shingle sets at or above which they are copies (near); 0.65 on
    4-word shingles catches copies with 3-5% of the words edited or a paragraph removed, added or moved, and drops
    no distinct document of the measured curve (docs/build-checks.md, benchmarks/curate_near_curve.py)."""
    shingle_words: int = 4
    """Normalised words per shingle (near); 4 (with threshold 0.65) from the measured curve; 5 is datatrove's."""
    num_perm: int = 112
    """MinHash permutations per signature (near): 112 gives a standard error of 0.045 at Jaccard 0.65; the LSH
    bands and rows follow from it and ``threshold`` (19 x 5 at the defaults)."""
    seed: int = DEFAULT_SEED
    """Seed of the MinHash permutations' multipliers (``curate.minhash``), hashed with each permutation's index."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--dedup {self.mode!r}: use one of {', '.join(MODES)}")
        if not 0.5 <= self.threshold < 1.0:
            raise ValueError(f"--dedup-threshold {self.threshold}: use a Jaccard similarity in [0.5, 1) (0.65 is the"
                             " default; exact copies are --dedup exact)")
        if not 1 <= self.shingle_words <= 32:
            raise ValueError(f"--dedup-shingle-words {self.shingle_words}: use 1..32 words per shingle (4 is the"
                             " default)")
        if not 16 <= self.num_perm <= 1024:
            raise ValueError(f"--dedup-num-perm {self.num_perm}: use 16..1024 MinHash permutations (112 is the"
                             " default)")
        if self.mode == "near":
            banding(self.threshold, self.num_perm)  # raises with the fix when no banding fits

    @property
    def bands(self) -> int:
        return banding(self.threshold, self.num_perm)[0]

    @property
    def rows(self) -> int:
        return banding(self.threshold, self.num_perm)[1]


SIGNATURE_COLUMNS = ("id", "content", "sig")


def signature_schema(cfg: DedupConfig) -> pa.Schema:
    return pa.schema([("id", pa.string()), ("content", CONTENT_TYPE), ("sig", pa.binary(4 * cfg.num_perm))])


def sig_matrix(col: pa.Array | pa.ChunkedArray, num_perm: int) -> np.ndarray:
    """The (rows x num_perm) uint32 signatures of a ``sig`` column (its null rows as zeros)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks else pa.array([], pa.binary(4 * num_perm))
    if not len(col):
        return np.zeros((0, num_perm), dtype=np.uint32)
    width = 4 * num_perm
    data = np.frombuffer(col.buffers()[1], dtype=np.uint8)[col.offset * width:(col.offset + len(col)) * width]
    return data.view("<u4").reshape(len(col), num_perm)


class Signatures:
    """Per document: its id, content hash and (near) MinHash signature, null for a document with no words.
    Documents an earlier filter dropped (``contract.live``) are left out."""

    def __init__(self, cfg: DedupConfig):
        self.cfg = cfg

    @contract.per_slice
    def __call__(self, table: pa.Table) -> pa.Table:
        table = table.filter(pa.array(contract.live(table)))
        text = contract.texts(table)
        content = content_hashes(text)
        schema = signature_schema(self.cfg)
        n = len(table)
        if self.cfg.mode != "near" or not n:
            return pa.table({"id": table[contract.ID], "content": content,
                             "sig": pa.nulls(n, schema.field("sig").type)}, schema=schema)
        sigs, has = signatures(words(text), self.cfg.shingle_words, self.cfg.num_perm, self.cfg.seed)
        sig = pa.FixedSizeBinaryArray.from_buffers(schema.field("sig").type, n,
                                                   [pa.array(has).buffers()[1],
                                                    pa.py_buffer(sigs.astype("<u4").tobytes())])
        return pa.table({"id": table[contract.ID], "content": content, "sig": sig}, schema=schema)


def band_rows(table: pa.Table, cfg: DedupConfig) -> pa.Table:
    """One row per (document with a signature, band): ``key`` (the band's uint64 key), ``id``, ``content``."""
    table = table.filter(table["sig"].is_valid())
    keys = band_keys(sig_matrix(table["sig"], cfg.num_perm), cfg.bands, cfg.rows)
    take = pa.array(np.repeat(np.arange(len(table)), cfg.bands))
    return pa.table({"key": pa.array(keys.ravel(), pa.uint64()), "id": table["id"].take(take),
                     "content": table["content"].take(take)})


def verified(a: pa.Array, b: pa.Array, sig_a: np.ndarray, sig_b: np.ndarray, cfg: DedupConfig):
    ok = pa.array(verify(sig_a, sig_b, cfg.threshold))
    return a.filter(ok), b.filter(ok)


def drop_set(signature_tables: Iterable[pa.Table], cfg: DedupConfig) -> pa.Table:
    """The plain-loop global decision: every signature in memory (module docstring)."""
    tables = list(signature_tables)
    t = pa.concat_tables(tables).combine_chunks() if tables else signature_schema(cfg).empty_table()
    exact = exact_groups(t["id"], t["content"])
    near = contract.DUPLICATE_SCHEMA.empty_table()
    if cfg.mode == "near":
        bands = band_rows(t, cfg)
        a, b = bucket_edges(bands["key"].to_numpy(), bands["id"], bands["content"])
        row = {i: r for r, i in enumerate(t["id"].to_pylist())}
        sigs = sig_matrix(t["sig"], cfg.num_perm)
        ia = np.array([row[x] for x in a.to_pylist()], dtype=np.int64)
        ib = np.array([row[x] for x in b.to_pylist()], dtype=np.int64)
        near = components([verified(a, b, sigs[ia], sigs[ib], cfg)])
    return merge(exact, near)


class ApplyDrops:
    """The filter that removes what a drop set names (``DUPLICATE_SCHEMA`` rows)."""

    def __init__(self, drops: pa.Table):
        self.drops = drops.combine_chunks()

    def __call__(self, table: pa.Table) -> contract.Filtered:
        ids = table[contract.ID]
        at = pc.index_in(ids, value_set=self.drops["id"])
        drop = at.is_valid().to_numpy(zero_copy_only=False)
        at = at.filter(at.is_valid())
        return contract.split(table, drop, self.drops["reason"].take(at).to_pylist(),
                              self.drops["duplicate_of"].take(at).to_pylist())
