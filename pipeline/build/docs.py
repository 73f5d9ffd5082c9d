"""The docs stage: one unit of input -> its documents split into sentences and WordPiece-tokenized.

    DocsStep   unit -> _work/docs/<uid>.arrow, its pool members -> _work/pool/parts/<uid>.arrow, DocsMarker

A unit is read, split and tokenized in one process: its sentences never cross a process boundary. Random-next pool:
a document is a member when ``derive_seed(seed, doc_id, "pool") < ctx.pool_threshold``, a threshold the driver sets
from the planned input size before any work (``pipeline/build/pool.py``), so membership is a seeded Bernoulli sample
of the whole corpus that each docs item decides for its own documents. The WordPiece encoder is loaded once per
process and cached by vocabulary.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from collections import Counter
from collections.abc import Iterator
from typing import ClassVar

import numpy as np
import pyarrow as pa

from pipeline.build.config import BuildState
from pipeline.build.executor import Shared, Stage
from pipeline.build.markers import Marker, write_marker
from pipeline.build.work import WORK_SUFFIX, StepContext, cached, write_table
from pipeline.pairs import PackedDoc
from pipeline.readers import InputError, ReadReport, Unit, read_unit
from pipeline.rng import derive_seed
from pipeline.schema import token_dtype, work_docs_schema

log = logging.getLogger(__name__)

_ENCODE_BATCH = 20000  # sentences per encode call: bounds the tokenizer's temporary memory


@dataclasses.dataclass(frozen=True)
class DocsMarker(Marker):
    """A unit read, split, tokenized: its documents file and its part of the random-next pool are committed."""

    stage: ClassVar[str] = "docs"
    uid: str
    path: str
    documents: int
    sentences: int
    tokens: int
    read_documents: int
    dropped: dict[str, int]
    bad_files: dict[str, str]
    pool_documents: int
    pool_tokens: int

    @property
    def key(self) -> str:
        return self.uid


def encoder_for(vocab: Shared, do_lower_case: bool):
    """One WordPiece encoder per process and vocabulary; its word cache stays warm from unit to unit."""
    def load():
        from pipeline.tokenize import WordPieceEncoder

        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per item: the executor gives the parallelism
        return WordPieceEncoder(tokens=vocab.get(), do_lower_case=do_lower_case)
    return cached("encoder", (vocab.key, do_lower_case), load)


@dataclasses.dataclass
class SplitUnit:
    uid: str
    path: str
    doc_ids: list[str]
    sentences: list[list[str]]
    report: ReadReport


def read_split(unit: Unit, ctx: StepContext) -> SplitUnit:
    """Read one unit's documents and split them into sentences (lines, with presplit)."""
    from pipeline.sentences import split_sentences

    report = ReadReport()
    doc_ids, sentences = [], []
    for doc in read_unit(unit, ctx.read, ctx.endpoint_url, report):
        if ctx.read.presplit:
            sents = [s.strip() for line in doc.lines for s in line.split("\n")]
        else:
            sents = split_sentences(" ".join(doc.lines))
        doc_ids.append(doc.doc_id)
        sentences.append([s for s in sents if s and not s.isspace()])
    return SplitUnit(unit.uid, unit.path, doc_ids, sentences, report)


def tokenize_commit(split: SplitUnit, ctx: StepContext, encoder) -> DocsMarker:
    """WordPiece the unit's sentences; commit its documents, then its pool members, then the marker."""
    flat = [s for sents in split.sentences for s in sents]
    parts = [encoder.encode_flat(flat[i:i + _ENCODE_BATCH]) for i in range(0, len(flat), _ENCODE_BATCH)]
    del flat
    dtype = token_dtype(ctx.vocab_size)
    # Vectorised bookkeeping over all sentences of the unit (no Python loop per sentence).
    lens = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
    values = np.concatenate([p[0] for p in parts]).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
    del parts
    n_per_doc = np.array([len(s) for s in split.sentences], dtype=np.int64)
    doc_of_sent = np.repeat(np.arange(len(n_per_doc)), n_per_doc)
    keep = lens > 0  # the reference drops lines with no tokens ...
    kept_per_doc = np.bincount(doc_of_sent[keep], minlength=len(n_per_doc))
    tok_per_doc = np.bincount(doc_of_sent, weights=lens, minlength=len(n_per_doc)).astype(np.int64)
    doc_keep = kept_per_doc > 0  # ... and removes documents left empty; we count them
    dropped = Counter(split.report.dropped)
    if (~doc_keep).sum():
        dropped["no_tokens"] += int((~doc_keep).sum())
    doc_ids = [d for d, k in zip(split.doc_ids, doc_keep.tolist()) if k]
    inner = np.zeros(int(keep.sum()) + 1, dtype=np.int32)
    np.cumsum(lens[keep], out=inner[1:])
    outer = np.zeros(len(doc_ids) + 1, dtype=np.int32)
    np.cumsum(kept_per_doc[doc_keep], out=outer[1:])
    sentences = pa.ListArray.from_arrays(pa.array(outer), pa.ListArray.from_arrays(pa.array(inner), pa.array(values)))
    table = pa.Table.from_arrays([pa.array(doc_ids, pa.string()), sentences], schema=work_docs_schema(ctx.vocab_size))
    write_table(ctx.url("docs", split.uid + WORK_SUFFIX), table, ctx)
    seed = ctx.instances.seed
    member = np.array([derive_seed(seed, d, "pool") < ctx.pool_threshold for d in doc_ids], dtype=bool)
    pool_tokens = int(tok_per_doc[doc_keep][member].sum()) if len(doc_ids) else 0
    if member.any():
        write_table(ctx.pool_part_url(split.uid), table.filter(pa.array(member)), ctx)
    marker = DocsMarker(uid=split.uid, path=split.path, documents=len(doc_ids), sentences=int(keep.sum()),
                        tokens=int(lens.sum()), read_documents=len(split.doc_ids), dropped=dict(dropped),
                        bad_files=dict(split.report.bad_files), pool_documents=int(member.sum()),
                        pool_tokens=pool_tokens)
    write_marker(ctx.work, marker, ctx.endpoint_url)
    return marker


@dataclasses.dataclass(frozen=True)
class DocsStep:
    """Read, split, tokenize and commit one unit in one process: its sentences never cross a process boundary."""

    ctx: StepContext
    vocab: Shared

    def setup(self) -> None:
        import pyarrow.compute  # noqa: F401 - imported here so a warm worker's first unit does not pay for it

        import pipeline.sentences  # noqa: F401
        encoder_for(self.vocab, self.ctx.do_lower_case)

    def __call__(self, unit: Unit) -> DocsMarker:
        return tokenize_commit(read_split(unit, self.ctx), self.ctx, encoder_for(self.vocab, self.ctx.do_lower_case))


def docs_stage(s: BuildState) -> Stage:
    return Stage("docs", DocsStep(s.ctx, s.vocab), {u.uid: u for u in s.units}, DocsMarker)


# --- reading a _work docs table back (the pool and the instances stages)


def doc_arrays(table: pa.Table) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(doc ids, sentences per document as offsets, token offsets per sentence, tokens) of a _work docs table."""
    col = table.column("sentences").combine_chunks()
    if not len(col):
        return [], np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(0, np.uint16)
    inner = col.values
    return (table.column("doc_id").to_pylist(), col.offsets.to_numpy(), inner.offsets.to_numpy(),
            inner.values.to_numpy())


def iter_docs(table: pa.Table) -> Iterator[tuple[str, PackedDoc]]:
    """(doc_id, packed document) from a _work docs table, the tokens as zero-copy numpy views."""
    doc_ids, outer, inner, flat = doc_arrays(table)
    for i, doc_id in enumerate(doc_ids):
        s0, s1 = outer[i], outer[i + 1]
        t0 = inner[s0]
        yield doc_id, PackedDoc(flat[t0 : inner[s1]], (inner[s0 : s1 + 1] - t0).astype(np.int64))


def doc_totals(markers: list[DocsMarker], report: ReadReport, on_error: str) -> tuple[dict, Counter, dict[str, str]]:
    """Sum the docs markers; find files that gave nothing at all (empty after decompression, whitespace only)."""
    dropped: Counter = Counter()
    bad_files = dict(report.bad_files)
    per_file: Counter = Counter()
    for m in markers:
        dropped.update(m.dropped)
        bad_files.update(m.bad_files)
        per_file[m.path] += m.read_documents + sum(m.dropped.values())
    for path, n in per_file.items():
        if n == 0 and path not in bad_files:
            if on_error == "fail":
                raise InputError(f"input {path}: no documents in it (empty after decompression?) [empty_file]."
                                 " Fix or remove the file, or pass --on-error skip.")
            bad_files[path] = "empty_file"
    for reason in bad_files.values():
        dropped[reason] += 1  # file-level reasons count files
    totals = {k: sum(getattr(m, k) for m in markers) for k in ("documents", "sentences", "tokens")}
    return totals, dropped, bad_files
