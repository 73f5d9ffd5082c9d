"""The read pass: the input is read ONCE. A unit's documents are read, split into sentences, WordPiece-tokenized
and committed as its tokenized documents; the random-next pool and the instances pass read those, never the input.

    ReadCorpus -> [document filters] -> SplitTokenize -> WriteDocs
                  _work/docs/<uid>.arrow (documents with tokens: id, pool hash, sentences as id lists), then its
                  ReadMarker (what the reader saw and dropped, the unit's documents, sentences and tokens)

A unit's documents are kept in the order of their pool hash (``derive_seed(seed, id, "pool")``, then id), in one
record batch per band of that hash (``POOL_BANDS``, halving towards 0): the random-next pool, the documents whose
hash is below a threshold the driver sets from the exact token count once this pass is done, is read as the first
bands of every unit (``pool.py``), never the whole of them. The order also makes a unit's rows independent of how its
documents arrived (a file's order, a Dataset's blocks).

Document filters (curation: a user's or the build's own) are operators over the reader's rows placed between
``ReadCorpus`` and ``SplitTokenize``: ``pa.Table -> pa.Table``, dropping rows and adding one report row per batch
(``id`` null, ``report`` ``{"dropped": {reason: count}}``) that ``WriteDocs`` adds to the unit's counts
(docs/architecture.md, "To add a filter"). What the pass keeps is in the markers: the driver sums them, it never
reads a document.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.curation import filters
from pipeline.docs import (  # noqa: F401
    DOCS_DIR,
    POOL_BANDS,
    ReadCorpus,
    SplitTokenize,
    doc_totals,
    docs_table,
    docs_url,
    packed_docs,
    pool_hashes,
    power_of_two_histogram,
    unk_from_markers,
    vocab_info_for,
    write_batches,
)
from pipeline.executor import Shared
from pipeline.markers import Marker, marker, write_marker
from pipeline.rows import RowStage, UserError, by_unit, take_ops, user_error
from pipeline.state import BuildState
from pipeline.work import StepContext
from storage.fs import join, list_names, remove_tree

log = logging.getLogger(__name__)

@marker("read")
class ReadMarker(Marker):
    """A unit read: what the reader saw (``read_documents``) and dropped (by reason, filters' and empty documents'
    included), the documents kept (those with tokens), their sentences and tokens, and [UNK] among them."""

    uid: str
    """The unit's id: the marker's key."""
    path: str
    """The unit's input file, redacted (no userinfo, no signature): it is kept in the output folder."""
    read_documents: int
    """Documents the reader gave, before any filter or the drop of documents without tokens."""
    dropped: dict[str, int]
    """Records and documents dropped, by reason: the reader's, the filters' and ``no_tokens`` / ``duplicate_id``."""
    bad_files: dict[str, str]
    """Input files skipped with --on-error skip, by redacted path: the reason each was skipped."""
    documents: int
    """Documents kept: those with at least one token."""
    sentences: int
    """Sentences with tokens in the kept documents (the reference drops sentences without tokens)."""
    tokens: int
    """WordPiece tokens of the kept documents, [UNK] included."""
    unk_tokens: int
    """[UNK] tokens among ``tokens``: whether the vocabulary fits the text (corpus/checks.py)."""
    tokens_per_document: dict[str, int]
    """Kept documents by tokens, in power-of-two bins keyed by their lower bound (str: JSON keys); summed across
    units into the manifest's histogram."""
    ops: dict[str, tuple] = dataclasses.field(default_factory=dict)
    """The operators' statistics for the unit (``rows.take_ops``): rows in and out, bytes out, CPU and wall
    seconds, by operator."""


def merge_reports(reports: list[dict]) -> dict:
    """A unit's report rows as one: the reader's (the one with ``read_documents``, or its error) and the filters'
    (``{"dropped": {...}}``, added up)."""
    (main,) = [r for r in reports if "read_documents" in r or "error" in r]
    dropped = Counter(main.get("dropped", {}))
    for r in reports:
        if r is not main:
            dropped.update(r["dropped"])
    return main | {"dropped": dict(dropped)}


def write_docs(uid: str, rows: pa.Table, ctx: StepContext, unk_id: int, ops: dict | None = None
               ) -> ReadMarker | UserError:
    """Commit one unit's tokenized documents (pool-hash order, a record batch per band), then its marker."""
    reports = [json.loads(r) for r in rows.column("report").to_pylist() if r is not None]
    report = merge_reports(reports)
    if (err := user_error(report)) is not None:
        return err
    docs = rows.filter(pc.invert(pc.is_null(rows.column("id"))))
    ids = docs.column("id").to_pylist()
    packed = packed_docs(docs)
    kept = [(i, d) for i, d in zip(ids, packed, strict=False) if d is not None]
    dropped = Counter(report["dropped"])
    if len(kept) < len(ids):
        dropped["no_tokens"] += len(ids) - len(kept)  # the reference removes documents left empty
    hashes = pool_hashes([i for i, _ in kept], ctx.instances.seed)
    order = sorted(range(len(kept)), key=lambda k: (int(hashes[k]), kept[k][0]))
    # Equal ids sort side by side.
    twins = {k for a, k in zip(order, order[1:], strict=False) if kept[a][0] == kept[k][0]}
    if twins:
        first = kept[min(twins)][0]
        if ctx.read.on_error == "fail":
            return UserError("InputError", f"input {report['path']}: two documents with id {first!r} "
                             "[duplicate_id]: ids seed every random choice of the build, so they must be unique. Fix "
                             "the ids, pass --id-field '' to name documents by their position, or --on-error skip")
        dropped["duplicate_id"] += len(twins)
        order = [k for k in order if k not in twins]
    hashes, kept = hashes[order] if order else hashes[:0], [kept[k] for k in order]
    write_batches(docs_url(ctx, uid), docs_table(kept, hashes, ctx.vocab_size), ctx.endpoint_url)
    filters.commit_unit(uid, report["path"], reports, docs, [i for i, _ in kept], ctx)  # curation's parts, if any
    marker = ReadMarker(
        uid=uid, path=report["path"], read_documents=report["read_documents"], dropped=dict(dropped),
        bad_files=report["bad_files"], documents=len(kept), sentences=sum(len(d.sent_offsets) - 1 for _, d in kept),
        tokens=int(sum(len(d.tokens) for _, d in kept)),
        unk_tokens=sum(int(np.count_nonzero(d.tokens == unk_id)) for _, d in kept),
        tokens_per_document=power_of_two_histogram([len(d.tokens) for _, d in kept]), ops=ops or {})
    write_marker(ctx.work, marker, ctx.endpoint_url, ctx.fence)
    return marker


@dataclasses.dataclass(frozen=True)
class WriteDocs:
    """The read pass's sink: each unit's tokenized documents committed atomically, then its marker."""

    ctx: StepContext
    """Where the docs files and markers go, and the seed of the pool hash."""
    vocab: Shared
    """The vocabulary's tokens: its [UNK] id, to count [UNK] in each unit."""

    def write(self, tables: list[pa.Table]) -> list[ReadMarker | UserError]:
        unk_id = vocab_info_for(self.vocab).unk_id
        return [write_docs(uid, rows, self.ctx, unk_id, take_ops()) for uid, rows in by_unit(tables)]


# Operators over the reader's rows that drop documents (curation), planned from the state: each planner returns an
# operator (``pa.Table -> pa.Table``, see the module's docstring) or None when the build does not ask for it.
# The build's own: language, quality, decontamination, then dedup's signatures (pipeline/curation/filters.py).
DOC_FILTERS: tuple = filters.FILTERS


def read_stage(s: BuildState) -> RowStage:
    """The one pass over the input; it starts (and warms) the worker processes every later stage uses."""
    ctx = s.ctx
    tokenize = SplitTokenize(ctx, s.vocab)
    s.executor.warm(tokenize.setup, len(s.units) or 1 << 20)
    filters = tuple(op for plan in DOC_FILTERS if (op := plan(s)) is not None)
    if s.inputs.documents is not None:  # a user's Dataset, streamed (ray_data/documents.py)
        from pipeline.ray_data.documents import DatasetRows, WriteFragments

        remove_tree(ctx.url(DOCS_DIR), ctx.endpoint_url)  # rewritten by every run: only the run knows what it read
        rows = DatasetRows(s.inputs.id_column, s.cfg.read.text_field, s.cfg.read.presplit, s.cfg.read.on_error)
        return RowStage("read", {}, ReadCorpus(ctx), (rows, *filters, tokenize), WriteFragments(ctx, s.vocab),
                        ReadMarker, source=s.inputs.documents, after=_dataset_read)
    return RowStage("read", {u.uid: u for u in s.units}, ReadCorpus(ctx), (*filters, tokenize),
                    WriteDocs(ctx, s.vocab), ReadMarker, s.unit_sizes, after=_files_read)


def _files_read(s: BuildState) -> BuildState:
    markers: list[ReadMarker] = s.markers["read"]  # type: ignore[assignment]
    doc_units = {m.uid: u for m, u in zip(markers, s.units, strict=True) if m.documents}
    return _read(dataclasses.replace(s, doc_units=doc_units,
                                     doc_files=tuple(docs_url(s.ctx, uid) for uid in doc_units)))


def _dataset_read(s: BuildState) -> BuildState:
    """What the Dataset's pass read: its stamp (the digest taken on the way), its units, the fragments."""
    from pipeline.ray_data.documents import DATASET_PATH, bucket_dir, dataset_units

    fragments = s.markers["read"]
    text_bytes = sum(f.text_bytes for f in fragments)  # type: ignore[attr-defined]
    digest = sum(f.digest for f in fragments) % (1 << 256)  # type: ignore[attr-defined]
    read = sum(f.read_documents for f in fragments)  # type: ignore[attr-defined]
    stamps = [{"path": DATASET_PATH, "size": text_bytes, "etag": f"{digest:064x}", "mtime": None,
               "documents": read}]
    by_bucket: dict[int, list] = {}
    for f in fragments:
        by_bucket.setdefault(f.bucket, []).append(f)  # type: ignore[attr-defined]
    markers = [ReadMarker(
        uid=f"g{b:03d}", path=DATASET_PATH, read_documents=sum(f.read_documents for f in fs),
        dropped=dict(sum((Counter(f.dropped) for f in fs), Counter())), bad_files={},
        documents=sum(f.documents for f in fs), sentences=sum(f.sentences for f in fs),
        tokens=sum(f.tokens for f in fs), unk_tokens=sum(f.unk_tokens for f in fs),
        tokens_per_document=dict(sum((Counter(f.tokens_per_document) for f in fs), Counter())))
        for b, fs in sorted(by_bucket.items())]
    units = tuple(dataset_units(text_bytes, s.cfg.unit_bytes, s.cfg.work))
    doc_files = tuple(join(bucket_dir(s.ctx, b), name) for b in sorted(by_bucket)
                      for name in sorted(list_names(bucket_dir(s.ctx, b), s.ctx.endpoint_url))
                      if name.endswith(".arrow"))
    return _read(dataclasses.replace(s.with_markers("read", markers), inputs=dataclasses.replace(s.inputs,
                                     stamps=stamps), units=units, doc_units={u.uid: u for u in units},
                                     doc_files=doc_files))


CURATION_FLAGS = {"language": "--languages (or --language-threshold)", "quality": "--quality and its --quality-*",
                  "exact_duplicate": "--dedup", "near_duplicate": "--dedup", "contaminated": "--decontaminate",
                  "mix": "--mix"}


def _no_documents_fix(dropped: dict) -> str:
    """What to check when no document is left: the curation flags that dropped the most, when they did; else how
    the files are read (--format/--text-field)."""
    by_flag: dict[str, int] = {}
    for reason, n in dropped.items():
        flag = CURATION_FLAGS.get(str(reason).split(":")[0])
        if flag:
            by_flag[flag] = by_flag.get(flag, 0) + n
    if not by_flag:
        return "check the --format/--text-field and the inputs"
    flag = max(by_flag, key=by_flag.get)
    return (f"curation dropped them: {flag} removed {by_flag[flag]:,}; loosen or drop {flag.split(' ')[0]} (e.g. "
            "--languages with the corpus's language)")


def _read(s: BuildState) -> BuildState:
    """What the whole corpus holds, now known exactly: refuse an input without documents, or a vocabulary that turns
    it into [UNK], before the instances pass; the exact token count plans the pool and the shards."""
    markers: list[ReadMarker] = s.markers["read"]  # type: ignore[assignment]
    dropped, _ = doc_totals(markers, s.report, s.cfg.read.on_error)  # fails on empty files (or counts them)
    inputs = list(s.cfg.inputs) or ["the documents Dataset"]
    if sum(m.read_documents for m in markers) == 0:
        raise ValueError(f"no documents in {inputs} (dropped: {dict(dropped)}); check the --format/--text-field and"
                         " the inputs")
    if not any(m.documents for m in markers):
        raise ValueError(f"no documents with tokens in {inputs} (dropped: {dict(dropped)}); "
                         + _no_documents_fix(dropped))
    if (w := unk_from_markers(s.cfg, markers, "of the corpus's tokens")) is not None:
        log.warning("%s", w)
        s = s.warned(w)
    return dataclasses.replace(s, corpus_tokens=sum(m.tokens for m in markers))
