"""A unit's documents: read, split into sentences and WordPiece-tokenized, in one process; what the passes share.

``ReadCorpus`` gives a unit's documents as rows, ``SplitTokenize`` adds their WordPiece ids (the read pass,
``read.py``, commits them); ``docs_table`` / ``doc_arrays`` are the tokenized documents' Arrow form in ``_work``,
which the pool and the instances pass read. The WordPiece encoder is loaded once per process and cached by
vocabulary.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from corpus.pairs import PackedDoc
from corpus.readers import InputError, ReadReport, Unit, read_unit
from corpus.rng import derive_seed
from corpus.schema import token_dtype, work_docs_schema
from pipeline.executor import Shared
from pipeline.rows import users_mistake
from pipeline.work import WORK_SUFFIX, StepContext, cached
from storage.fs import open_atomic
from storage.redact import redact_text, redact_url

_ENCODE_BATCH = 20000  # sentences per encode call: bounds the tokenizer's temporary memory


def encoder_for(vocab: Shared, do_lower_case: bool):
    """One WordPiece encoder per process and vocabulary; its word cache stays warm from unit to unit."""
    def load():
        from corpus.tokenize import WordPieceEncoder

        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per item: the executor gives the parallelism
        return WordPieceEncoder(tokens=vocab.get(), do_lower_case=do_lower_case)
    return cached("encoder", (vocab.key, do_lower_case), load)


@dataclasses.dataclass
class UnitText:
    """One unit's documents as read: ids and lines, and what the reader dropped."""

    uid: str
    """The unit's id (``Unit.uid``)."""
    path: str
    """The input file the unit is a piece of, as given (``Unit.path``)."""
    doc_ids: list[str]
    """Each document's id, in the order the reader gave them: the record's own, or file key and position."""
    lines: list[list[str]]
    """Each document's text lines, matching ``doc_ids``."""
    report: ReadReport
    """What the reader dropped, by reason, and the files it could not read to the end."""


def read_docs(unit: Unit, ctx: StepContext) -> UnitText:
    report = ReadReport()
    doc_ids, lines = [], []
    for doc in read_unit(unit, ctx.read, ctx.endpoint_url, report):
        doc_ids.append(doc.doc_id)
        lines.append(doc.lines)
    return UnitText(unit.uid, unit.path, doc_ids, lines, report)


def split(lines: list[str], presplit: bool) -> list[str]:
    """A document's sentences (its lines, with presplit), blank ones left out."""
    if presplit:
        sents = [s.strip() for line in lines for s in line.split("\n")]
    else:
        from corpus.sentences import split_sentences

        sents = split_sentences(" ".join(lines))
    return [s for s in sents if s and not s.isspace()]


def tokenize_docs(sentences: list[list[str]], encoder, vocab_size: int) -> list[PackedDoc | None]:
    """WordPiece every document's sentences; None for a document with no tokens (the reference drops sentences
    with no tokens and removes documents left empty). Bookkeeping is vectorised over all sentences of the batch."""
    flat = [s for sents in sentences for s in sents]
    parts = [encoder.encode_flat(flat[i:i + _ENCODE_BATCH]) for i in range(0, len(flat), _ENCODE_BATCH)]
    del flat
    dtype = token_dtype(vocab_size)
    lens = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
    values = np.concatenate([p[0] for p in parts]).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
    del parts
    n_per_doc = np.array([len(s) for s in sentences], dtype=np.int64)
    doc_of_sent = np.repeat(np.arange(len(n_per_doc)), n_per_doc)
    keep = lens > 0
    kept_per_doc = np.bincount(doc_of_sent[keep], minlength=len(n_per_doc))
    sent_off = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
    np.cumsum(lens[keep], out=sent_off[1:])
    doc_off = np.zeros(len(n_per_doc) + 1, dtype=np.int64)
    np.cumsum(kept_per_doc, out=doc_off[1:])
    out: list[PackedDoc | None] = []
    for i in range(len(n_per_doc)):
        s0, s1 = doc_off[i], doc_off[i + 1]
        if s0 == s1:
            out.append(None)
        else:
            t0 = sent_off[s0]
            out.append(PackedDoc(values[t0:sent_off[s1]], sent_off[s0:s1 + 1] - t0))
    return out


def docs_table(docs: list[tuple[str, PackedDoc]], pool_hash: np.ndarray, vocab_size: int) -> pa.Table:
    """Tokenized documents as a _work docs table: one row per document, its pool hash, its sentences as id lists."""
    schema = work_docs_schema(vocab_size)
    dtype = token_dtype(vocab_size)
    values = np.concatenate([d.tokens for _, d in docs]).astype(dtype, copy=False) if docs else np.zeros(0, dtype)
    lens = np.concatenate([np.diff(d.sent_offsets) for _, d in docs]) if docs else np.zeros(0, np.int64)
    inner = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=inner[1:])
    outer = np.zeros(len(docs) + 1, dtype=np.int32)
    np.cumsum([len(d.sent_offsets) - 1 for _, d in docs], out=outer[1:])
    sentences = pa.ListArray.from_arrays(pa.array(outer), pa.ListArray.from_arrays(pa.array(inner), pa.array(values)))
    return pa.Table.from_arrays([pa.array([i for i, _ in docs], pa.string()),
                                 pa.array(np.asarray(pool_hash, np.uint64)), sentences], schema=schema)


# Bands of the pool hash, one record batch each: [0, 2**44), [2**44, 2**45), ..., [2**63, 2**64). The pool of a
# fraction p of the corpus reads the bands below p * 2**64: at most 2p of each unit's documents (for p >= 2**-20).
POOL_BANDS: tuple[int, ...] = (0,) + tuple(1 << b for b in range(44, 65))
DOCS_DIR = "docs"


def docs_url(ctx: StepContext, uid: str) -> str:
    return ctx.url(DOCS_DIR, uid + WORK_SUFFIX)


def pool_hashes(ids: list[str], seed: int) -> np.ndarray:
    """Each document's pool hash: it is in the random-next pool when the hash is below the pool's threshold."""
    return np.array([derive_seed(seed, d, "pool") for d in ids], dtype=np.uint64)


def write_batches(url: str, table: pa.Table, endpoint_url: str | None) -> None:
    """Commit tokenized documents in pool-hash order as a docs file: one record batch per band (``POOL_BANDS``)."""
    bounds = np.searchsorted(table.column("pool_hash").to_numpy(), np.array(POOL_BANDS[1:-1], np.uint64))
    edges = [0, *bounds.tolist(), table.num_rows]
    with open_atomic(url, endpoint_url) as f:
        with pa.ipc.new_file(f, table.schema) as w:
            for a, b in zip(edges, edges[1:], strict=False):
                part = table.slice(a, b - a).combine_chunks().to_batches()
                w.write_batch(part[0] if part else pa.RecordBatch.from_pylist([], schema=table.schema))


def doc_arrays(table: pa.Table, id_column: str = "doc_id") -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(doc ids, sentences per document as offsets, token offsets per sentence, tokens) of a _work docs table."""
    col = table.column("sentences").combine_chunks()
    if not len(col):
        return [], np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(0, np.uint16)
    inner = col.values
    return (table.column(id_column).to_pylist(), col.offsets.to_numpy(), inner.offsets.to_numpy(),
            inner.values.to_numpy())


def power_of_two_histogram(counts: Sequence[int]) -> dict[str, int]:
    """{lower bound 2**k: how many counts fall in [2**k, 2**(k+1))} of positive integers: mergeable across units
    by adding, and readable from a line to a book."""
    if not len(counts):
        return {}
    _, exp = np.frexp(np.asarray(counts, dtype=np.float64))  # count = m * 2**exp, m in [0.5, 1): exact for ints
    lows, n = np.unique(np.left_shift(1, exp.astype(np.int64) - 1), return_counts=True)
    return {str(int(k)): int(v) for k, v in zip(lows, n, strict=False)}


def unk_from_markers(cfg, markers: list, of: str) -> str | None:
    """What the tokenized text says about the vocabulary: [UNK] per file, warned or refused (corpus/checks.py).
    ``markers``: per-unit markers with ``path``, ``unk_tokens`` and ``tokens``."""
    from corpus.checks import unk_check as check

    per_file: dict[str, tuple[int, int]] = {}
    for m in markers:
        u, t = per_file.get(m.path, (0, 0))
        per_file[m.path] = (u + m.unk_tokens, t + m.tokens)
    vocab = f"--vocab {cfg.vocab}" if cfg.vocab else "the vocabulary trained on the input"
    return check(sum(m.unk_tokens for m in markers), sum(m.tokens for m in markers), per_file, vocab,
                 cfg.checks.max_unk_fraction, of)


def doc_totals(markers: list, report: ReadReport, on_error: str) -> tuple[Counter, dict[str, str]]:
    """Records dropped by reason and files skipped, from per-unit markers (``path``, ``read_documents``,
    ``dropped``, ``bad_files``); fails on (or, with on_error=skip, counts) files that gave nothing at all
    (empty after decompression, whitespace only)."""
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
    return dropped, bad_files


# --- Rows: what the per-unit stages hand each other (pipeline/rows.py runs them; Ray Data or a loop).
# A unit's block holds one row per document, in unit order (``ord``), then the unit's report row (``id`` null,
# ``report`` the reader's counts as JSON, or the user's error). Every operator passes the report row on, so the
# sink that commits the unit knows what the reader saw even when the unit had no document at all.

def read_block(unit: Unit, ctx: StepContext) -> pa.Table:
    """ReadCorpus: a unit's documents as rows (``unit``, ``ord``, ``id``, ``lines``) and its report row."""
    try:
        text = read_docs(unit, ctx)
    except (InputError, ValueError) as e:  # a user's mistake: carried to the driver as a value (rows.UserError)
        if not users_mistake(e):
            raise
        report = {"path": redact_url(unit.path), "error": [type(e).__name__, redact_text(str(e))]}
        return _block(unit.uid, [], [], report)
    # The path as markers keep it (in the output folder): without userinfo or signature, like the bad files'.
    report = {"path": redact_url(unit.path), "read_documents": len(text.doc_ids),
              "dropped": dict(text.report.dropped), "bad_files": dict(text.report.bad_files)}
    return _block(unit.uid, text.doc_ids, text.lines, report)


@dataclasses.dataclass(frozen=True)
class ReadCorpus:
    """The read of one unit as rows (``read_block``): what each of the datasource's read tasks runs."""

    ctx: StepContext
    """Where _work is and how the inputs are read."""

    def __call__(self, unit: Unit) -> pa.Table:
        return read_block(unit, self.ctx)


def vocab_info_for(vocab: Shared):
    from corpus.create_instances import VocabInfo

    return cached("vocab_info", vocab.key, lambda: VocabInfo.from_tokens(vocab.get()))


def _block(uid: str, doc_ids: list[str], lines: list[list[str]], report: dict) -> pa.Table:
    n = len(doc_ids)
    return pa.table({"unit": pa.array([uid] * (n + 1), pa.string()),
                     "ord": pa.array(np.arange(n + 1, dtype=np.int64)),
                     "id": pa.array(doc_ids + [None], pa.string()),
                     "lines": pa.array(lines + [None], pa.list_(pa.string())),
                     "report": pa.array([None] * n + [json.dumps(report, sort_keys=True)], pa.string())})


def _list_array(values: np.ndarray, lengths: np.ndarray, valid: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values), mask=pa.array(~valid))


@dataclasses.dataclass(frozen=True)
class SplitTokenize:
    """Documents -> sentences -> WordPiece ids, per row: ``lines`` replaced by ``tokens`` (the document's ids, null
    for a document with no tokens) and ``sent_offsets`` (where each sentence starts in them, then the end)."""

    ctx: StepContext
    """The casing, the presplit flag and the vocabulary's size (which picks uint16 or uint32 ids)."""
    vocab: Shared
    """The vocabulary's tokens, handed to the workers once; each process builds its encoder from it once."""

    def setup(self) -> None:
        import corpus.sentences  # noqa: F401 - imported here so a warm worker's first unit does not pay for it
        encoder_for(self.vocab, self.ctx.do_lower_case)

    def __call__(self, batch: pa.Table) -> pa.Table:
        ids = batch.column("id").to_pylist()
        lines = batch.column("lines").to_pylist()
        idx = [i for i, d in enumerate(ids) if d is not None]
        encoder = encoder_for(self.vocab, self.ctx.do_lower_case)
        packed = tokenize_docs([split(lines[i], self.ctx.read.presplit) for i in idx], encoder, self.ctx.vocab_size)
        dtype = token_dtype(self.ctx.vocab_size)
        docs: list[PackedDoc | None] = [None] * len(ids)
        for i, d in zip(idx, packed, strict=False):
            docs[i] = d
        valid = np.array([d is not None for d in docs], dtype=bool)
        got = [d for d in docs if d is not None]
        tokens = _list_array(np.concatenate([d.tokens for d in got]).astype(dtype, copy=False) if got
                             else np.zeros(0, dtype), np.array([len(d.tokens) if d else 0 for d in docs]), valid)
        offsets = _list_array(np.concatenate([d.sent_offsets for d in got]).astype(np.int64, copy=False) if got
                              else np.zeros(0, np.int64),
                              np.array([len(d.sent_offsets) if d else 0 for d in docs]), valid)
        return batch.drop_columns(["lines"]).append_column("tokens", tokens).append_column("sent_offsets", offsets)


def packed_docs(batch: pa.Table) -> list[PackedDoc | None]:
    """The ``tokens``/``sent_offsets`` of SplitTokenize's rows as PackedDocs (zero-copy views), None where null."""
    tokens, offsets = batch.column("tokens").combine_chunks(), batch.column("sent_offsets").combine_chunks()
    tv, to = tokens.values.to_numpy(zero_copy_only=False), tokens.offsets.to_numpy()
    ov, oo = offsets.values.to_numpy(zero_copy_only=False), offsets.offsets.to_numpy()
    valid = tokens.is_valid().to_numpy(zero_copy_only=False)
    return [PackedDoc(tv[to[i]:to[i + 1]], ov[oo[i]:oo[i + 1]]) if valid[i] else None for i in range(len(tokens))]

