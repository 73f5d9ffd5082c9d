"""Any Ray Dataset of documents as the build's input: ``build(config, documents=ds)``.

The Dataset needs an id column (``BuildConfig.id_column``, default ``id``) and a text column
(``read.text_field``, default ``text``); anything a user did before (``filter``, ``map_batches``: language ID,
dedup, a quality classifier; ``ray.data.read_parquet`` of a lake, a Hugging Face dataset) is theirs. Ray Data
gives no order and no fixed blocks, so the build fixes its own, from the documents alone:

- **Identity**: a digest of what was read, order-free (the sum mod 2**256 of sha256(id, text) over the documents),
  with their count and bytes. It stands in for the input files' stamps (``identity.py``): a rerun on changed
  documents is refused, never reported complete; on the same documents it resumes like a file build.
- **Units**: ``ceil(bytes / unit_bytes)`` units; a document goes to unit ``derive_seed(id) % units``, and a unit's
  documents are read in id order (a trailing ``:<number>`` compared as a number, so ``file:99`` < ``file:100``).
  Each unit is a folder of fragments under ``_work/documents/`` (one per (block, unit), written by a Ray Data
  ``map_batches``): no shuffle, so no all-to-all operator and no actor pool on a small cluster. ``ReadCorpus``
  reads a unit by concatenating its fragments and ordering them by id (``read_documents``, format ``documents``).

So the same documents give the same shards whatever their blocks or order. The same documents from a file give
the same shards as that file when they carry the file's document ids (``<file key>:<offset>``) and the file is one
unit (at most ``unit_bytes`` of text, the default 4 MiB) and the random-next pool takes every document (the
default ``--pool-tokens`` for such a file): a file's units are byte ranges and its pool's threshold is planned from
its stored size, a Dataset's from its text. Otherwise the same instances (ids and seeds are the same) land in other
shards. The pass over the documents runs the user's pipeline once: it is materialized (Ray's object store, spilled
to disk when big) and read twice, for the digest and for the fragments.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.build.ray_data.guard import guarded
from pipeline.readers import Doc, InputError, ReadOptions, ReadReport, Unit
from pipeline.rng import derive_seed
from pipeline.storage import FileInfo, filesystem_for, join, list_names, open_atomic, remove_tree

DATASET_PATH = "ray.data.Dataset"  # how the input is named in the manifest, its stamps and messages
DOCUMENTS_DIR = "documents"
_NUMBERED = re.compile(r"^(.*):(\d{1,20})$")


def sort_key(doc_id: str) -> str:
    """Document ids in natural order: ``file:99`` before ``file:100`` (the order of a file's documents)."""
    m = _NUMBERED.match(doc_id)
    return f"{m.group(1)}:{int(m.group(2)):020d}" if m else doc_id
@dataclasses.dataclass(frozen=True)
class Digest:
    """One batch's documents: count, text bytes and the order-free sum of their sha256 (as a hex string)."""

    id_column: str
    text_column: str

    def __call__(self, batch: pa.Table) -> pa.Table:
        ids = batch.column(self.id_column).to_pylist()
        texts = batch.column(self.text_column).to_pylist()
        total, nbytes = 0, 0
        for i, t in zip(ids, texts):
            b = (t or "").encode()
            nbytes += len(b)
            h = hashlib.sha256(str(i).encode() + b"\0" + (b"\1" if t is None else b"\2") + b).digest()
            total += int.from_bytes(h, "big")
        return pa.table({"documents": [len(ids)], "bytes": [nbytes], "digest": [f"{total % (1 << 256):064x}"]})


@dataclasses.dataclass(frozen=True)
class WriteFragments:
    """A batch's documents split by unit, each part written as a fragment of its unit's folder (id, text), named
    by the hash of its ids so that a retried task rewrites the same file."""

    id_column: str
    text_column: str
    folder: str
    units: int
    endpoint_url: str | None = None

    def __call__(self, batch: pa.Table) -> pa.Table:
        ids = batch.column(self.id_column).cast(pa.string())
        if ids.null_count:
            raise ValueError(f"a document of the Dataset has a null {self.id_column!r}: every document needs an id")
        unit = np.array([derive_seed("dataset-unit", i) % self.units for i in ids.to_pylist()], dtype=np.int64)
        table = pa.table({"id": ids, "text": batch.column(self.text_column).cast(pa.string())})
        written = []
        for u in np.unique(unit).tolist():
            part = table.filter(pa.array(unit == u))
            name = hashlib.sha256("\0".join(part.column("id").to_pylist()).encode()).hexdigest()[:32]
            with open_atomic(join(self.folder, f"{u:05d}", name + ".arrow"), self.endpoint_url) as f:
                with pa.ipc.new_file(f, part.schema) as w:
                    w.write_table(part)
            written.append(part.num_rows)
        return pa.table({"written": [sum(written)]})


def check_columns(ds: Any, id_column: str, text_column: str) -> None:
    names = ds.columns()
    for col, flag in ((id_column, "id_column"), (text_column, "read.text_field (--text-field)")):
        if col not in names:
            raise ValueError(f"the documents Dataset has no column {col!r} (columns: {names}): add it (for example"
                             f" with map_batches) or name the column with BuildConfig.{flag}")


def dataset_stamp(ds: Any, id_column: str, text_column: str) -> dict[str, Any]:
    """The Dataset's identity: {"path", "size" (bytes of text), "etag" (the digest), "mtime", "documents"}."""
    rows = ds.map_batches(guarded(Digest(id_column, text_column)), batch_size=None,
                          batch_format="pyarrow").take_all()
    digest = sum(int(r["digest"], 16) for r in rows) % (1 << 256)
    return {"path": DATASET_PATH, "size": int(sum(r["bytes"] for r in rows)), "etag": f"{digest:064x}",
            "mtime": None, "documents": int(sum(r["documents"] for r in rows))}


def dataset_units(ds: Any, stamp: dict[str, Any], id_column: str, text_column: str, work: str, unit_bytes: int,
                  endpoint_url: str | None = None) -> tuple[list[FileInfo], list[Unit]]:
    """Write the documents as fragments of their units under ``<work>/documents`` (anew: a rerun's blocks may
    differ); the input as a FileInfo and its units."""
    folder = join(work, DOCUMENTS_DIR)
    remove_tree(folder, endpoint_url)
    n = max(1, -(-stamp["size"] // unit_bytes))
    ds.map_batches(guarded(WriteFragments(id_column, text_column, folder, n, endpoint_url)), batch_size=None,
                   batch_format="pyarrow").materialize()
    info = FileInfo(DATASET_PATH, DATASET_PATH, stamp["size"], stamp["etag"], None)
    per_unit = stamp["size"] // n
    units = [Unit(f"d{u:05d}", DATASET_PATH, DATASET_PATH, "documents", u * per_unit,
                  stamp["size"] if u == n - 1 else (u + 1) * per_unit, data=join(folder, f"{u:05d}"))
             for u in range(n)]
    return [info], units


def read_documents(unit: Unit, opts: ReadOptions, endpoint_url: str | None, report: ReadReport) -> Iterator[Doc]:
    """A unit of a Dataset's documents (format ``documents``): its fragments, in id order. A null text is a
    dropped record (``missing_text_field``), or fails with on_error='fail'."""
    fs, folder = filesystem_for(unit.data, endpoint_url)
    tables = []
    for name in sorted(list_names(unit.data, endpoint_url)):
        with fs.open(f"{folder}/{name}", "rb") as f:
            tables.append(pa.ipc.open_file(f).read_all())
    ids = [i for t in tables for i in t.column("id").to_pylist()]
    texts = [x for t in tables for x in t.column("text").to_pylist()]
    order = sorted(range(len(ids)), key=lambda k: sort_key(ids[k]))
    for a, b in zip(order, order[1:]):
        if ids[a] == ids[b]:
            raise InputError(f"the documents Dataset has two documents with id {ids[a]!r}: ids must be unique"
                             " (they seed every random choice of the build)")
    for k in order:
        if texts[k] is None:
            if opts.on_error == "fail":
                raise InputError(f"the documents Dataset: document {ids[k]!r} has a null text [missing_text_field]."
                                 " Drop it (ds.filter) or pass on_error='skip'.")
            report.dropped["missing_text_field"] += 1
            continue
        yield Doc(ids[k], texts[k].split("\n") if opts.presplit else [texts[k]])
