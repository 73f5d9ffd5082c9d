"""Any Ray Dataset of documents as the build's input, streamed: ``build(config, documents=ds)``.

The Dataset needs an id column (``id_column``, default ``id``) and a text column (``read.text_field``, default
``text``); anything a user did before (``filter``, ``map_batches``: language ID, a quality classifier;
``ray.data.read_parquet`` of a lake, a Hugging Face dataset) is theirs. The user's Dataset is the source of the read
pass, which runs it once (nothing is materialized, no document's text is copied to ``_work``):

    <the user's Dataset> -> MapBatches(DatasetRows) -> [document filters] -> MapBatches(SplitTokenize)
                         -> Write (WriteFragments: tokenized documents, as fragments of their buckets)

Ray Data gives no order and no fixed blocks, so the build fixes its own, from the documents alone:

- **Buckets, then units.** A document's unit hash (``derive_seed("dataset-unit", id)``) puts it in one of
  ``BUCKETS`` buckets (its top bits); each write task commits its tokenized documents as one fragment per bucket
  (``_work/docs/g<bucket>/<digest of its ids>.arrow``, the docs-file format of ``read.py``: pool-hash order, a
  record batch per band). Once the pass is done the text's size is known: ``ceil(bytes / unit_bytes)`` units,
  unit ``k`` holding the documents whose unit hash is in ``[k, k + 1) * 2**64 / units``, read from the fragments
  of the buckets that range overlaps (``ReadDataset``), in the order of their pool hash and id, like a file's unit.
- **Identity**: what the pass hashed on the way, an order-free digest of the documents (the sum mod 2**256 of
  sha256(id, text)), with their count and bytes. It stands in for the input files' stamps (``identity.py``),
  checked once the pass is done: a rerun on changed documents is refused, never reported complete; on the same
  documents (in any order) it resumes from the committed units of the later stages.

So the same documents give the same shards whatever their blocks or order, and the same records in a file
(``--input``, ids from the records' ``id``) give the same documents, the same pool and, when the file is one unit
as the Dataset is (at most ``unit_bytes`` of text, 4 MiB by default), the same shards byte for byte; otherwise the
same instances land in other shards, since a file's units are byte ranges.
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus.readers import InputError, Unit
from corpus.rng import derive_seed
from pipeline.docs import (
    DOCS_DIR,
    docs_table,
    packed_docs,
    pool_hashes,
    power_of_two_histogram,
    vocab_info_for,
    write_batches,
)
from pipeline.drops import SUFFIX as DROP_SUFFIX
from pipeline.drops import kept
from pipeline.executor import Shared
from pipeline.rows import by_unit, take_ops
from pipeline.work import StepContext, read_work_table
from storage.fs import filesystem_for, join, list_names

DATASET_PATH = "ray.data.Dataset"  # how the input is named in the manifest, its stamps and messages
BUCKETS = 64  # fragments per write task at most; a unit reads the buckets its hash range overlaps
_SHIFT = 58  # a unit hash's top 6 bits: its bucket


def unit_hash(doc_id: str) -> int:
    return derive_seed("dataset-unit", doc_id)


def bucket_dir(ctx: StepContext, b: int) -> str:
    return ctx.url(DOCS_DIR, f"g{b:03d}")


def digest_of(ids: list[str], texts: list[str | None]) -> tuple[int, int]:
    """(order-free digest, text bytes) of documents: the sum of sha256(id, text), kept mod 2**256 by the caller."""
    total, nbytes = 0, 0
    for i, t in zip(ids, texts, strict=False):
        b = (t or "").encode()
        nbytes += len(b)
        total += int.from_bytes(hashlib.sha256(str(i).encode() + b"\0" + (b"\1" if t is None else b"\2") + b)
                                .digest(), "big")
    return total, nbytes


@dataclasses.dataclass(frozen=True)
class DatasetRows:
    """A batch of the user's Dataset as the reader's rows (``unit`` = the bucket, ``ord``, ``id``, ``lines``) and
    one report row per bucket (documents read, dropped, text bytes and the digest of what was read)."""

    id_column: str
    """The Dataset's column of document ids (cast to strings; a null one is the user's mistake)."""
    text_column: str
    """The Dataset's column of document text (``read.text_field``)."""
    presplit: bool
    """Whether the text is already one sentence per line (``read.presplit``): its lines are the sentences."""
    on_error: str
    """``fail``: a document with a null text fails the build; ``skip``: it is dropped and counted as
    ``missing_text_field``."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        ids = batch.column(self.id_column).cast(pa.string())
        if ids.null_count:
            raise ValueError(f"a document of the Dataset has a null {self.id_column!r}: every document needs an id")
        ids = ids.to_pylist()
        texts = batch.column(self.text_column).cast(pa.string()).to_pylist()
        buckets = np.array([unit_hash(i) >> _SHIFT for i in ids], dtype=np.int64)
        unit, ords, out_ids, lines, reports = [], [], [], [], []
        for b in np.unique(buckets).tolist():
            idx = np.flatnonzero(buckets == b).tolist()
            digest, nbytes = digest_of([ids[k] for k in idx], [texts[k] for k in idx])
            missing = [k for k in idx if texts[k] is None]
            if missing and self.on_error == "fail":
                raise InputError(f"the documents Dataset: document {ids[missing[0]]!r} has a null text "
                                 "[missing_text_field]. Drop it (ds.filter) or pass on_error='skip'.")
            kept = [k for k in idx if texts[k] is not None]
            name = f"g{b:03d}"
            unit += [name] * (len(kept) + 1)
            ords += list(range(len(kept) + 1))
            out_ids += [ids[k] for k in kept] + [None]
            lines += [texts[k].split("\n") if self.presplit else [texts[k]] for k in kept] + [None]
            reports += [None] * len(kept) + [{"path": DATASET_PATH, "read_documents": len(idx),
                                              "dropped": {"missing_text_field": len(missing)} if missing else {},
                                              "bad_files": {}, "text_bytes": nbytes, "digest": f"{digest:x}"}]
        import json

        return pa.table({"unit": pa.array(unit, pa.string()), "ord": pa.array(ords, pa.int64()),
                         "id": pa.array(out_ids, pa.string()), "lines": pa.array(lines, pa.list_(pa.string())),
                         "report": pa.array([None if r is None else json.dumps(r) for r in reports], pa.string())})


@dataclasses.dataclass(frozen=True)
class Fragment:
    """What a write task committed for one bucket (returned to the driver, which sums them)."""

    bucket: int
    """The bucket (the top bits of the documents' unit hash, of BUCKETS) the fragment holds documents of."""
    read_documents: int
    """Documents of the Dataset that reached the bucket, before any was dropped."""
    dropped: dict[str, int]
    """Documents dropped by reason (``missing_text_field``, ``no_tokens``)."""
    documents: int
    """Documents written to the fragment, tokenized."""
    sentences: int
    """Sentences of the written documents."""
    tokens: int
    """WordPiece tokens of the written documents."""
    unk_tokens: int
    """[UNK] tokens among them: what the build's vocabulary check reads."""
    tokens_per_document: dict[str, int]
    """Written documents by token count, a power-of-two histogram ({lower bound: documents}): mergeable by adding."""
    text_bytes: int
    """UTF-8 bytes of the text read (what sizes the units once the pass is done)."""
    digest: int
    """Order-free digest of the documents read: the sum of sha256(id, text) mod 2**256, so the driver's sum of the
    fragments' digests is the same whatever Ray's blocks or order."""
    ops: dict = dataclasses.field(default_factory=dict)
    """The operators' statistics since the task's last report, by operator (``rows.take_ops``): rows in, rows out,
    bytes out, CPU seconds, wall seconds."""


@dataclasses.dataclass(frozen=True)
class WriteFragments:
    """The Dataset read pass's sink: each bucket's documents of a write task, tokenized, as one fragment."""

    ctx: StepContext
    """Where _work is (the fragments go under its docs folder), the pool's seed and the vocabulary's size."""
    vocab: Shared
    """The build's vocabulary, shared once: its [UNK] id counts the unknown tokens."""

    def write(self, tables: list[pa.Table]) -> list[Fragment]:
        import json

        unk_id = vocab_info_for(self.vocab).unk_id
        out = []
        for name, rows in by_unit(tables):
            reports = [json.loads(r) for r in rows.column("report").to_pylist() if r is not None]
            docs = rows.filter(pc.invert(pc.is_null(rows.column("id"))))
            kept = [(i, d) for i, d in zip(docs.column("id").to_pylist(), packed_docs(docs), strict=False)
                    if d is not None]
            dropped = sum((Counter(r["dropped"]) for r in reports), Counter())
            if len(kept) < docs.num_rows:
                dropped["no_tokens"] += docs.num_rows - len(kept)
            hashes = pool_hashes([i for i, _ in kept], self.ctx.instances.seed)
            order = sorted(range(len(kept)), key=lambda k: (int(hashes[k]), kept[k][0]))
            kept, hashes = [kept[k] for k in order], hashes[order] if order else hashes
            bucket = int(name[1:])
            if kept:
                fid = hashlib.sha256("\0".join(i for i, _ in kept).encode()).hexdigest()[:32]
                write_batches(join(bucket_dir(self.ctx, bucket), fid + ".arrow"), docs_table(kept, hashes,
                                                                                              self.ctx.vocab_size),
                              self.ctx.endpoint_url)
            out.append(Fragment(
                bucket=bucket, read_documents=sum(r.get("read_documents", 0) for r in reports), dropped=dict(dropped),
                documents=len(kept), sentences=sum(len(d.sent_offsets) - 1 for _, d in kept),
                tokens=int(sum(len(d.tokens) for _, d in kept)),
                unk_tokens=sum(int(np.count_nonzero(d.tokens == unk_id)) for _, d in kept),
                tokens_per_document=power_of_two_histogram([len(d.tokens) for _, d in kept]),
                text_bytes=sum(r.get("text_bytes", 0) for r in reports),
                digest=sum(int(r["digest"], 16) for r in reports if "digest" in r) % (1 << 256), ops=take_ops()))
        return out


def dataset_units(text_bytes: int, unit_bytes: int, work: str) -> list[Unit]:
    """The units of a Dataset's documents: ``ceil(bytes / unit_bytes)`` ranges of the unit hash."""
    n = max(1, -(-text_bytes // unit_bytes))
    return [Unit(f"d{k:05d}", DATASET_PATH, DATASET_PATH, "documents", k, n, data=join(work, DOCS_DIR))
            for k in range(n)]


def read_dataset_unit(unit: Unit, ctx: StepContext, dropped: frozenset[str] = frozenset()
                      ) -> tuple[pa.Table, str | None]:
    """A Dataset unit's tokenized documents (the fragments of the buckets its range overlaps, kept to its range),
    in pool-hash then id order; and the user's mistake, if two documents share an id."""
    k, n = unit.start, unit.end
    lo, hi = (k << 64) // n, ((k + 1) << 64) // n
    tables = []
    fs, _ = filesystem_for(unit.data, ctx.endpoint_url)
    for b in range(lo >> _SHIFT, ((hi - 1) >> _SHIFT) + 1):
        folder = bucket_dir(ctx, b)
        for name in sorted(n for n in list_names(folder, ctx.endpoint_url) if not n.endswith(DROP_SUFFIX)):
            url = join(folder, name)
            with fs.open(filesystem_for(url, ctx.endpoint_url)[1], "rb") as f:
                tables.append(kept(read_work_table(f), url, dropped, ctx))
    from corpus.schema import work_docs_schema

    table = pa.concat_tables(tables) if tables else work_docs_schema(ctx.vocab_size).empty_table()
    ids = table.column("doc_id").to_pylist()
    mine = np.array([lo <= unit_hash(i) < hi for i in ids], dtype=bool)
    table = table.filter(pa.array(mine)).sort_by([("pool_hash", "ascending"), ("doc_id", "ascending")])
    ids = table.column("doc_id").to_pylist()
    twin = next((a for a, b in zip(ids, ids[1:], strict=False) if a == b), None)
    error = None if twin is None else (f"the documents Dataset has two documents with id {twin!r} [duplicate_id]:"
                                       " ids must be unique (they seed every random choice of the build)")
    return table.combine_chunks(), error
