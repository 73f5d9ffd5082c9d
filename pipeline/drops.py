"""A global step's decision: documents the later passes leave out, decided over the whole corpus after the read pass
(exact or near duplicates, a source's weights), so that the pool and the instances agree with it.

A global step is a stage between ``read`` and ``pool`` in ``STAGES`` (docs/architecture.md, "A global step"). Its
input is what the read pass committed (``state.doc_files``: every file of tokenized documents), never the raw
corpus. For each such file it removes documents from, it commits a drop list (``write_drop_list``: the ids and why,
beside the file) before its markers, and its hook returns ``leave_out(state, ...)`` with what it removed. Then:

- the pool's merge and the instances pass's reads leave the listed ids out (``kept``);
- the manifest's totals count what remains, and ``totals.dropped`` the step's reasons;
- the pool's threshold and the default shard count follow the tokens that remain.

A step may also repeat documents (``--mix`` weights above 1): a copies list beside the file (``write_copies``) and
``repeat`` in its hook; the instances pass then makes ``dupe_factor`` passes per copy, and the default shard count
counts the copies' tokens.
"""
from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.work import StepContext, read_table, write_table

SUFFIX = ".drop.arrow"


def drop_list_url(docs_file: str) -> str:
    """Where the drop list of a file of tokenized documents goes: beside it."""
    return docs_file.removesuffix(".arrow") + SUFFIX


def write_drop_list(docs_file: str, ids: list[str], reasons: list[str], ctx: StepContext,
                    duplicate_of: list[str | None] | None = None, detail: list[str | None] | None = None) -> None:
    """The ids a step removes from ``docs_file``, why, for duplicates the document each one copies, and what was
    measured (``detail``): what the build's report says of them (pipeline/curation/reports.py)."""
    none = [None] * len(ids)
    write_table(drop_list_url(docs_file), pa.table({
        "doc_id": pa.array(ids, pa.string()), "reason": pa.array(reasons, pa.string()),
        "duplicate_of": pa.array(none if duplicate_of is None else duplicate_of, pa.string()),
        "detail": pa.array(none if detail is None else detail, pa.string())}), ctx)


def read_drop_list(docs_file: str, ctx: StepContext) -> pa.Table:
    return read_table(drop_list_url(docs_file), ctx)


def kept(table: pa.Table, docs_file: str, dropped: frozenset[str], ctx: StepContext) -> pa.Table:
    """``table`` (rows of ``docs_file``, a ``doc_id`` column) without the documents its drop list names."""
    if docs_file not in dropped:
        return table
    ids = read_table(drop_list_url(docs_file), ctx).column("doc_id")
    return table.filter(pc.invert(pc.is_in(table.column("doc_id"), value_set=ids)))


# Documents a step repeats (``--mix`` weights above 1): ``copies`` per id (2 or more; the rest are made once), beside
# the docs file like its drop list. The instances pass makes each copy's passes with passes of their own.
COPIES_SUFFIX = ".copies.arrow"


def copies_url(docs_file: str) -> str:
    return docs_file.removesuffix(".arrow") + COPIES_SUFFIX


def write_copies(docs_file: str, ids: list[str], copies: list[int], ctx: StepContext) -> None:
    write_table(copies_url(docs_file), pa.table({"doc_id": pa.array(ids, pa.string()),
                                                 "copies": pa.array(copies, pa.int32())}), ctx)


def copies_of(table: pa.Table, docs_file: str, copied: frozenset[str], ctx: StepContext) -> np.ndarray | None:
    """Copies of each row of ``table`` (a ``doc_id`` column; 1 for a row the list does not name), None when
    ``docs_file`` has no copies list."""
    if docs_file not in copied:
        return None
    listed = read_table(copies_url(docs_file), ctx)
    at = pc.index_in(table.column("doc_id"), value_set=listed.column("doc_id"))
    n = listed.column("copies").take(at).fill_null(1)
    return n.to_numpy(zero_copy_only=False).astype(np.int64)


def repeat(s, files: list[str], tokens: int):
    """A step's hook: the state once ``files`` (of ``s.doc_files``) have copies lists, whose extra copies hold
    ``tokens``."""
    unknown = set(files) - set(s.doc_files)
    assert not unknown, f"copies lists for files the read pass did not write: {sorted(unknown)[:3]}"
    return dataclasses.replace(s, copied=s.copied | frozenset(files), repeat_tokens=s.repeat_tokens + tokens)


@dataclasses.dataclass(frozen=True)
class LeftOut:
    """What a global step removed, summed over its files: subtracted from the read pass's totals."""

    documents: int = 0
    """Documents the drop lists remove."""
    sentences: int = 0
    """Sentences of the removed documents."""
    tokens: int = 0
    """Their WordPiece tokens, [UNK] included: subtracted from the corpus's tokens that plan the pool and shards."""
    unk_tokens: int = 0
    """[UNK] tokens among ``tokens``."""
    reasons: Counter = dataclasses.field(default_factory=Counter)
    """Removed documents by reason (``exact_duplicate``, ``near_duplicate``, ``mix``): added to the manifest's
    ``totals.dropped``."""
    tokens_per_document: Counter = dataclasses.field(default_factory=Counter)
    """Removed documents by tokens, in the read marker's power-of-two bins (keyed by lower bound, as str)."""

    def __add__(self, other: LeftOut) -> LeftOut:
        return LeftOut(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)})


def leave_out(s, files: list[str], removed: LeftOut):
    """A global step's hook: the state once ``files`` (of ``s.doc_files``) have drop lists; ``removed`` is what they
    list."""
    unknown = set(files) - set(s.doc_files)
    assert not unknown, f"drop lists for files the read pass did not write: {sorted(unknown)[:3]}"
    return dataclasses.replace(s, dropped=s.dropped | frozenset(files), left_out=s.left_out + removed,
                               corpus_tokens=s.corpus_tokens - removed.tokens)
