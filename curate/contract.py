"""The one contract every curation filter keeps, so the build (or any Ray Data pipeline) can slot filters in.

Documents are a ``pyarrow.Table`` with an ``id`` (string), the text as ``text`` (string) or as ``lines`` (a list of
strings, the build's read rows: joined with newlines to be read), and optionally ``source`` (the input it came
from, what ``--mix`` weighs) and any other columns, which filters carry along untouched. Every row is a document:
a caller with rows of its own (the build's per-unit report rows) takes them out before a filter and puts them back
after (pipeline/curation/filters.py).

A filter is a callable ``table -> Filtered``: ``kept`` (the input's rows that stay, same columns, text possibly
edited), ``dropped`` (``DROPPED_SCHEMA``: id, source, reason, duplicate_of, detail; one row per removed document) and
``edited`` (same schema: documents kept with part of their text removed, e.g. ``--decontaminate-mode cut``).
Reasons are ``exact_duplicate``, ``near_duplicate``, ``contaminated``, ``language``, ``quality:<rule>`` and ``mix``;
``duplicate_of`` is set for the duplicates, ``detail`` says what was measured (a language and its score, a rule's
value, the evaluation file).

In a Ray Data pipeline one operator returns one table, so ``Rows(filter)`` is the filter as a ``map_batches``
operator: it returns the kept rows and the dropped ones together, the dropped ones marked (``drop_reason`` not null,
text cleared) so that the next filter skips them and the sink can write them to the report; ``split_rows`` takes
such a table apart again.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ID, TEXT, LINES, SOURCE = "id", "text", "lines", "source"
EXACT, NEAR, CONTAMINATED, LANGUAGE, MIX = "exact_duplicate", "near_duplicate", "contaminated", "language", "mix"
QUALITY = "quality:"  # + the rule's name
CUT = "contaminated_cut"  # an edit, not a drop

DUPLICATE_SCHEMA = pa.schema([("id", pa.string()), ("reason", pa.string()), ("duplicate_of", pa.string())])
DROPPED_SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string()), ("reason", pa.string()),
                            ("duplicate_of", pa.string()), ("detail", pa.string())])
# The columns Rows adds to a table (null on live rows).
MARKS = (("drop_reason", pa.string()), ("duplicate_of", pa.string()), ("drop_detail", pa.string()),
         ("edit", pa.string()))


# Text per call of a vectorised step (words, n-grams, MinHash): their temporary arrays are ~15x the text, so a
# worker's memory is bounded by this, whatever the size of the block Ray Data or the build hands it.
SLICE_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class Filtered:
    kept: pa.Table
    """The input's rows that stay, with the same columns (text possibly edited)."""
    dropped: pa.Table
    """One row per removed document (``DROPPED_SCHEMA``: id, source, reason, duplicate_of, detail)."""
    edited: pa.Table
    """Documents kept with part of their text removed (``DROPPED_SCHEMA``, e.g. ``contaminated_cut``)."""


def text_bytes(table: pa.Table) -> np.ndarray:
    """Bytes of text per row (0 where there is none)."""
    if TEXT in table.column_names:
        col = pc.binary_length(table.column(TEXT))
    else:
        col = pc.binary_length(pc.binary_join(table.column(LINES), "\n"))
    return pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(np.int64)


def per_slice(step):
    """A step over a table (-> table or Filtered) run on consecutive slices of at most ``SLICE_BYTES`` of text (a
    bigger document alone), the results concatenated in order: the same output, bounded memory."""
    def run(self, table: pa.Table):
        size = text_bytes(table)
        if size.sum() <= SLICE_BYTES:
            return step(self, table)
        ends = np.cumsum(size)
        cuts, start = [], 0
        while start < len(table):
            stop = max(int(np.searchsorted(ends, ends[start] - size[start] + SLICE_BYTES, side="right")), start + 1)
            cuts.append((start, stop))
            start = stop
        outs = [step(self, table.slice(a, b - a)) for a, b in cuts]
        if isinstance(outs[0], Filtered):
            return Filtered(*(pa.concat_tables([getattr(o, f) for o in outs])
                              for f in ("kept", "dropped", "edited")))
        return pa.concat_tables(outs)
    run.__doc__, run.__name__ = step.__doc__, step.__name__
    return run


def empty_dropped() -> pa.Table:
    return DROPPED_SCHEMA.empty_table()


def check_documents(table: pa.Table, where: str = "documents") -> None:
    """ValueError naming the fix when ``table`` cannot be curated."""
    names = set(table.column_names)
    if ID not in names:
        raise ValueError(f"{where}: no '{ID}' column (columns: {sorted(names)}); give every document an id")
    if table.column(ID).null_count:
        raise ValueError(f"{where}: {table.column(ID).null_count} row(s) without an id; give every document an id"
                         " (every row is a document)")
    if TEXT not in names and LINES not in names:
        raise ValueError(f"{where}: no '{TEXT}' (string) or '{LINES}' (list of strings) column (columns:"
                         f" {sorted(names)}); put each document's text in one of them")


def live(table: pa.Table) -> np.ndarray:
    """Which documents are still to curate: those no earlier filter dropped (``Rows`` marks, ``drop_reason``)."""
    if "drop_reason" not in table.column_names:
        return np.ones(len(table), dtype=bool)
    return table.column("drop_reason").is_null().to_numpy(zero_copy_only=False)


def texts(table: pa.Table) -> list[str | None]:
    """Each row's text (``lines`` joined with newlines); None where there is none."""
    if TEXT in table.column_names:
        return table.column(TEXT).to_pylist()
    return [None if lines is None else "\n".join(lines) for lines in table.column(LINES).to_pylist()]


def with_texts(table: pa.Table, rows: Sequence[int], new: Sequence[list[str]]) -> pa.Table:
    """``table`` with the text of ``rows`` replaced by the given sentences: as lines in a ``lines`` column, else
    joined by a blank line (a paragraph break: the build's splitter always ends a sentence there, so it finds the
    same sentences again)."""
    if not len(rows):
        return table
    col = LINES if LINES in table.column_names and TEXT not in table.column_names else TEXT
    values = table.column(col).to_pylist()
    for r, sentences in zip(rows, new, strict=False):
        values[r] = list(sentences) if col == LINES else "\n\n".join(sentences)
    i = table.column_names.index(col)
    return table.set_column(i, col, pa.array(values, table.schema.field(col).type))


def sources(table: pa.Table) -> list[str | None]:
    return table.column(SOURCE).to_pylist() if SOURCE in table.column_names else [None] * len(table)


def dropped_rows(table: pa.Table, rows: Sequence[int], reasons: Sequence[str],
                 duplicate_of: Sequence[str | None] | None = None,
                 details: Sequence[str | None] | None = None) -> pa.Table:
    """``DROPPED_SCHEMA`` rows for ``rows`` of ``table``."""
    idx = pa.array(np.asarray(rows, dtype=np.int64))
    n = len(rows)
    src = table.column(SOURCE).take(idx).cast(pa.string()) if SOURCE in table.column_names else pa.nulls(n, pa.string())
    return pa.table({"id": table.column(ID).take(idx), "source": src, "reason": pa.array(list(reasons), pa.string()),
                     "duplicate_of": pa.array(list(duplicate_of) if duplicate_of is not None else [None] * n,
                                              pa.string()),
                     "detail": pa.array(list(details) if details is not None else [None] * n, pa.string())},
                    schema=DROPPED_SCHEMA)


def split(table: pa.Table, drop: np.ndarray, reasons: Sequence[str], duplicate_of=None, details=None,
          edited: pa.Table | None = None) -> Filtered:
    """Filtered from a bool mask over ``table``'s rows and, for the dropped ones in row order, their reasons."""
    rows = np.flatnonzero(drop)
    return Filtered(table.filter(pa.array(~drop)), dropped_rows(table, rows, reasons, duplicate_of, details),
                    edited if edited is not None else empty_dropped())


class Rows:
    """A filter as one Ray Data / plain-loop operator over rows (module docstring): live rows go through the
    filter; rows an earlier filter dropped, and rows that are not documents, pass through as they are."""

    def __init__(self, make: Callable[[], Callable[[pa.Table], Filtered]]):
        self._make, self._filter = make, None  # built in the worker, once per process (a model, an index)

    def __call__(self, batch: pa.Table) -> pa.Table:
        if self._filter is None:
            self._filter = self._make()
        batch = _with_marks(batch)
        mask = live(batch)
        todo = batch.filter(pa.array(mask))
        out = self._filter(todo)
        parts = [batch.filter(pa.array(~mask)), _mark_edits(out.kept, out.edited)]
        if len(out.dropped):
            d = out.dropped
            gone = todo.filter(pc.is_in(todo.column(ID), value_set=d["id"]))
            order = pc.index_in(gone.column(ID), value_set=d["id"])
            text_col = TEXT if TEXT in gone.column_names else LINES
            gone = _set(gone, text_col, pa.nulls(len(gone), gone.schema.field(text_col).type))
            for name, values in (("drop_reason", d["reason"]), ("duplicate_of", d["duplicate_of"]),
                                 ("drop_detail", d["detail"])):
                gone = _set(gone, name, values.take(order))
            parts.append(gone)
        return pa.concat_tables(parts)


def _set(table: pa.Table, name: str, values) -> pa.Table:
    return table.set_column(table.column_names.index(name), name, values)


def _mark_edits(kept: pa.Table, edited: pa.Table) -> pa.Table:
    if not len(edited):
        return kept
    edits = dict(zip(edited["id"].to_pylist(), edited["detail"].to_pylist(), strict=False))
    return _set(kept, "edit", pa.array([edits.get(i, e) for i, e in zip(kept[ID].to_pylist(),
                                                                          kept["edit"].to_pylist(), strict=False)],
                                       pa.string()))


def _with_marks(batch: pa.Table) -> pa.Table:
    for name, typ in MARKS:
        if name not in batch.column_names:
            batch = batch.append_column(name, pa.nulls(len(batch), typ))
    return batch


def split_rows(table: pa.Table) -> Filtered:
    """Rows' output taken apart: kept (live rows and non-documents, without the marks), dropped and edited."""
    table = _with_marks(table)
    is_dropped = table.column("drop_reason").is_valid().to_numpy(zero_copy_only=False)
    gone = table.filter(pa.array(is_dropped))
    dropped = pa.table({"id": gone[ID], "source": gone[SOURCE].cast(pa.string()) if SOURCE in gone.column_names
                        else pa.nulls(len(gone), pa.string()), "reason": gone["drop_reason"],
                        "duplicate_of": gone["duplicate_of"], "detail": gone["drop_detail"]}, schema=DROPPED_SCHEMA)
    kept = table.filter(pa.array(~is_dropped))
    was_edited = kept.column("edit").is_valid().to_numpy(zero_copy_only=False)
    ed = kept.filter(pa.array(was_edited))
    edited = pa.table({"id": ed[ID], "source": ed[SOURCE].cast(pa.string()) if SOURCE in ed.column_names
                       else pa.nulls(len(ed), pa.string()), "reason": pa.array([CUT] * len(ed), pa.string()),
                       "duplicate_of": pa.nulls(len(ed), pa.string()), "detail": ed["edit"]}, schema=DROPPED_SCHEMA)
    return Filtered(kept.drop_columns([n for n, _ in MARKS]), dropped, edited)
