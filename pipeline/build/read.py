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
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.build.docs import (ReadCorpus, SplitTokenize, doc_totals, docs_table, packed_docs,
                                 power_of_two_histogram, unk_check, vocab_info_for)
from pipeline.build.executor import Shared
from pipeline.build.markers import Marker, write_marker
from pipeline.build.rows import RowStage, UserError, by_unit, user_error
from pipeline.build.state import BuildState
from pipeline.build.work import WORK_SUFFIX, StepContext
from pipeline.rng import derive_seed
from pipeline.storage import open_atomic

log = logging.getLogger(__name__)

# Bands of the pool hash, one record batch each: [0, 2**44), [2**44, 2**45), ..., [2**63, 2**64). The pool of a
# fraction p of the corpus reads the bands below p * 2**64: at most 2p of each unit's documents (for p >= 2**-20).
POOL_BANDS: tuple[int, ...] = (0,) + tuple(1 << b for b in range(44, 65))
DOCS_DIR = "docs"


def docs_url(ctx: StepContext, uid: str) -> str:
    return ctx.url(DOCS_DIR, uid + WORK_SUFFIX)


def pool_hashes(ids: list[str], seed: int) -> np.ndarray:
    """Each document's pool hash: it is in the random-next pool when the hash is below the pool's threshold."""
    return np.array([derive_seed(seed, d, "pool") for d in ids], dtype=np.uint64)


@dataclasses.dataclass(frozen=True)
class ReadMarker(Marker):
    """A unit read: what the reader saw (``read_documents``) and dropped (by reason, filters' and empty documents'
    included), the documents kept (those with tokens), their sentences and tokens, and [UNK] among them."""

    stage: ClassVar[str] = "read"
    uid: str
    path: str
    read_documents: int
    dropped: dict[str, int]
    bad_files: dict[str, str]
    documents: int
    sentences: int
    tokens: int
    unk_tokens: int
    tokens_per_document: dict[str, int]  # documents by tokens, in power-of-two bins keyed by their lower bound

    @property
    def key(self) -> str:
        return self.uid


def merge_reports(reports: list[dict]) -> dict:
    """A unit's report rows as one: the reader's (the one with ``read_documents``, or its error) and the filters'
    (``{"dropped": {...}}``, added up)."""
    (main,) = [r for r in reports if "read_documents" in r or "error" in r]
    dropped = Counter(main.get("dropped", {}))
    for r in reports:
        if r is not main:
            dropped.update(r["dropped"])
    return main | {"dropped": dict(dropped)}


def write_docs(uid: str, rows: pa.Table, ctx: StepContext, unk_id: int) -> ReadMarker | UserError:
    """Commit one unit's tokenized documents (pool-hash order, a record batch per band), then its marker."""
    report = merge_reports([json.loads(r) for r in rows.column("report").to_pylist() if r is not None])
    if (err := user_error(report)) is not None:
        return err
    docs = rows.filter(pc.invert(pc.is_null(rows.column("id"))))
    ids = docs.column("id").to_pylist()
    packed = packed_docs(docs)
    kept = [(i, d) for i, d in zip(ids, packed) if d is not None]
    dropped = Counter(report["dropped"])
    if len(kept) < len(ids):
        dropped["no_tokens"] += len(ids) - len(kept)  # the reference removes documents left empty
    hashes = pool_hashes([i for i, _ in kept], ctx.instances.seed)
    order = sorted(range(len(kept)), key=lambda k: (int(hashes[k]), kept[k][0]))
    table = docs_table([kept[k] for k in order], hashes[order] if order else hashes, ctx.vocab_size)
    bounds = np.searchsorted(table.column("pool_hash").to_numpy(), np.array(POOL_BANDS[1:-1], np.uint64))
    edges = [0, *bounds.tolist(), table.num_rows]
    with open_atomic(docs_url(ctx, uid), ctx.endpoint_url) as f:
        with pa.ipc.new_file(f, table.schema) as w:
            for a, b in zip(edges, edges[1:]):
                part = table.slice(a, b - a).combine_chunks().to_batches()
                w.write_batch(part[0] if part else pa.RecordBatch.from_pylist([], schema=table.schema))
    marker = ReadMarker(
        uid=uid, path=report["path"], read_documents=report["read_documents"], dropped=dict(dropped),
        bad_files=report["bad_files"], documents=len(kept), sentences=sum(len(d.sent_offsets) - 1 for _, d in kept),
        tokens=int(sum(len(d.tokens) for _, d in kept)),
        unk_tokens=sum(int(np.count_nonzero(d.tokens == unk_id)) for _, d in kept),
        tokens_per_document=power_of_two_histogram([len(d.tokens) for _, d in kept]))
    write_marker(ctx.work, marker, ctx.endpoint_url)
    return marker


@dataclasses.dataclass(frozen=True)
class WriteDocs:
    """The read pass's sink: each unit's tokenized documents committed atomically, then its marker."""

    ctx: StepContext
    vocab: Shared

    def write(self, tables: list[pa.Table]) -> list[ReadMarker | UserError]:
        unk_id = vocab_info_for(self.vocab).unk_id
        return [write_docs(uid, rows, self.ctx, unk_id) for uid, rows in by_unit(tables)]


# Operators over the reader's rows that drop documents (curation), planned from the state: each planner returns an
# operator (``pa.Table -> pa.Table``, see the module's docstring) or None when the build does not ask for it.
DOC_FILTERS: tuple = ()


def read_stage(s: BuildState) -> RowStage:
    """The one pass over the input; it starts (and warms) the worker processes every later stage uses."""
    ctx = s.ctx
    tokenize = SplitTokenize(ctx, s.vocab)
    s.executor.warm(tokenize.setup, len(s.units))
    filters = tuple(op for plan in DOC_FILTERS if (op := plan(s)) is not None)
    return RowStage("read", {u.uid: u for u in s.units}, ReadCorpus(ctx), (*filters, tokenize),
                    WriteDocs(ctx, s.vocab), ReadMarker, s.unit_sizes, after=_read)


def _read(s: BuildState) -> None:
    """What the whole corpus holds, now known exactly: refuse an input without documents, or a vocabulary that turns
    it into [UNK], before the instances pass; the exact token count plans the pool and the shards."""
    markers: list[ReadMarker] = s.markers["read"]  # type: ignore[assignment]
    dropped, _ = doc_totals(markers, s.report, s.cfg.read.on_error)  # fails on empty files (or counts them)
    inputs = list(s.cfg.inputs) or ["the documents Dataset"]
    if sum(m.read_documents for m in markers) == 0:
        raise ValueError(f"no documents in {inputs} (dropped: {dict(dropped)}); check the --format/--text-field and"
                         " the inputs")
    if not any(m.documents for m in markers):
        raise ValueError(f"no documents with tokens in {inputs} (dropped: {dict(dropped)}); check the"
                         " --format/--text-field and the inputs")
    if (w := unk_check(s.cfg, markers, "of the corpus's tokens")) is not None:
        log.warning("%s", w)
        s.warnings.append(w)
    s.corpus_tokens = sum(m.tokens for m in markers)
