"""Input formats -> documents, over fixed work units so that parallelism never changes the output.

Formats: plain text (blank line between documents, free-running text inside; with ``presplit`` one sentence per
line, the reference contract), JSON Lines with a text field, Parquet with a text column. ``.gz .bz2 .xz .zst`` are
decompressed on the fly.

Work units are fixed by the files alone: byte ranges of ``unit_bytes`` for uncompressed text and JSON Lines, one
row group for Parquet. A unit owns the documents that *start* inside its range (as Hadoop's line splits do) and
reads past its end to finish the last one. A document's id is its record's own ``id_field`` (JSON Lines, Parquet)
when it has one, else ``<file key>:<byte offset>`` (row index for Parquet), so ids, and every seed derived from
them, do not depend on the unit size or the number of workers, and the same records give the same documents in a
file or a Ray Dataset. The key has no compression suffix and offsets count decompressed bytes, so
``corpus.txt.gz`` gives the ids of ``corpus.txt``.

Compressed streams cannot seek. A compressed file of about one unit or less is one unit; a bigger one goes through
the pieces step first (``pipeline.inputs.pieces``): one item streams it once and commits pieces of about ``unit_bytes``
cut at document boundaries, and each piece becomes a unit whose ``data`` is the piece and whose ``base`` is the
piece's offset in the decompressed input, so its documents keep the ids they have in the uncompressed file.
``plan_units(..., exclude=...)`` leaves those files to that step.

Bad records are dropped and counted by reason, or raise ``InputError`` naming the file and position when
``on_error="fail"``. Memory per unit is bounded by ``max_record_bytes`` per record (a 100 MB line never lands in RAM).
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from collections.abc import Collection, Iterator
from typing import IO

import pyarrow.parquet as pq

from corpus.readers.ranged import Ranged
from storage.fs import (
    FileInfo,
    compression_of,
    filesystem_for,
    is_url,
    map_threads,
    storage_error,
    strip_compression,
    without_query,
)
from storage.redact import redact_url
from storage.retry import is_transient

log = logging.getLogger(__name__)

FORMATS = ("auto", "text", "jsonl", "parquet")
ON_ERROR = ("fail", "skip")
_CONTEXT = 64 << 10  # bytes read before a unit's start to learn whether its first line starts a document
_CHUNK = 256 << 10
# The modules whose exceptions are a storage client's failure (after its retries), not a bug of ours.
STORAGE_CLIENTS = ("aiohttp", "botocore", "s3fs", "fsspec", "gcsfs", "adlfs", "urllib3", "requests")


class InputError(ValueError):
    """A bad input file or record, raised with on_error='fail'. The message names the file and position."""


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    fmt: str = "auto"
    """Input format, one of ``FORMATS``; "auto" picks it per file by extension (JSON Lines, Parquet, else text)."""
    presplit: bool = False
    """Text holds one sentence per line (the reference's input contract), so lines are not split again."""
    text_field: str = "text"
    """The JSON Lines field or Parquet column that holds a document's text."""
    id_field: str = "id"
    """The field or column of a record's own id, when it has one; "": documents are named by file key and position."""
    on_error: str = "fail"
    """"fail": a bad file or record raises ``InputError`` naming it; "skip": it is counted by reason and left out."""
    max_record_bytes: int = 16 << 20
    """Longest record (a text document or a JSON line) in bytes; a longer one is a bad record
    (``record_too_long``), so memory per unit stays bounded."""

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"--format must be one of {FORMATS}, got {self.fmt!r}")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"--on-error must be one of {ON_ERROR}, got {self.on_error!r}")
        if self.max_record_bytes < 1024:
            raise ValueError("max_record_bytes must be at least 1024")


@dataclasses.dataclass(frozen=True)
class Unit:
    """A fixed piece of one input file: a byte range [start, end) (end None = to EOF) or a Parquet row group.

    Offsets are in the decompressed input. ``data``, when set, is where the bytes are read from instead of ``path``
    (a piece of a big compressed input, holding the input's bytes from offset ``base``); errors still name ``path``.
    """

    uid: str
    """Names the unit's markers and work files: ``<file index>-<unit index>`` (``d<k>`` for a Ray Dataset's)."""
    path: str
    """The input file's URL, named in errors."""
    key: str
    """The file's name in document ids (``FileInfo.key``: no compression suffix)."""
    fmt: str
    """The file's format, "text", "jsonl" or "parquet" (never "auto"); "documents" for a Ray Dataset's unit."""
    start: int
    """First byte of the range in the decompressed input, or the Parquet row group's index (a Dataset unit's k)."""
    end: int | None
    """End of the range (exclusive), or the row group's index + 1 (a Dataset's unit count); None: to the end of
    the file."""
    data: str | None = None
    """Where the bytes are read from when not ``path``: a piece of a big compressed input."""
    base: int = 0
    """Offset in the decompressed input of ``data``'s first byte, so a piece's documents keep their ids."""


@dataclasses.dataclass
class Doc:
    doc_id: str
    """The record's own id, else ``<file key>:<byte offset or row index>``: every seed of the document derives
    from it."""
    lines: list[str]
    """The document's text: its stripped lines for plain text, the record's text (split at newlines with
    ``presplit``) for JSON Lines and Parquet."""


@dataclasses.dataclass
class ReadReport:
    """What a unit's reader dropped, by reason (records), and files it could not read to the end."""

    dropped: Counter = dataclasses.field(default_factory=Counter)
    """Records dropped, by reason (``binary``, ``undecodable``, ``record_too_long``, ``bad_json``, ...)."""
    bad_files: dict[str, str] = dataclasses.field(default_factory=dict)
    """Redacted path -> reason, for the files skipped or not read to the end (``on_error="skip"``)."""


def input_format(path: str, fmt: str = "auto") -> str:
    if fmt != "auto":
        return fmt
    base = strip_compression(without_query(path)).lower()  # a presigned URL's signature is no extension
    if base.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if base.endswith((".parquet", ".pq")):
        return "parquet"
    return "text"


def plan_units(files: list[FileInfo], opts: ReadOptions, unit_bytes: int, endpoint_url: str | None = None,
               report: ReadReport | None = None, exclude: Collection[str] = ()) -> list[Unit]:
    """The fixed work units of the inputs, but those in ``exclude`` (paths left to the pieces step). Uids are
    ``<file index>-<unit index>`` over all of ``files``. Empty files fail here (or are counted with
    on_error='skip'). Parquet footers are read in parallel (one round trip each)."""
    fmts = [input_format(f.path, opts.fmt) for f in files]
    todo = [(i, f) for i, (f, fmt) in enumerate(zip(files, fmts, strict=False)) if f.path not in exclude]
    groups = dict(zip([i for i, _ in todo], map_threads(
        lambda item: _row_groups(item[1], endpoint_url) if fmts[item[0]] == "parquet" and item[1].size else None,
        todo), strict=False))
    units: list[Unit] = []
    for i, f in todo:
        fmt = fmts[i]
        if f.size == 0:
            _bad_file(opts, report, f.path, "empty_file", "the file is empty")
            continue
        if fmt == "parquet":
            if isinstance(groups[i], Exception):
                _bad_file(opts, report, f.path, "corrupt_file", f"not a readable Parquet file ({groups[i]})")
                continue
            units += [Unit(f"{i:05d}-{g:05d}", f.path, f.key, fmt, g, g + 1) for g in range(groups[i])]
            continue
        n = 1 if compression_of(f.path) else max(1, -(-f.size // unit_bytes))
        for g in range(n):
            end = None if g == n - 1 else (g + 1) * unit_bytes
            units.append(Unit(f"{i:05d}-{g:05d}", f.path, f.key, fmt, g * unit_bytes, end))
    return units


def _row_groups(f: FileInfo, endpoint_url: str | None) -> int | Exception:
    fs, p = filesystem_for(f.path, endpoint_url)
    try:
        with fs.open(p, "rb") as fh:
            return pq.ParquetFile(fh).metadata.num_row_groups
    except Exception as e:  # noqa: BLE001 - reported by the caller, naming the file
        return e


def _bad_file(opts: ReadOptions, report: ReadReport | None, path: str, reason: str, what: str) -> None:
    path = redact_url(path)  # shown, logged and kept in markers in the output folder: no userinfo, no signature
    if opts.on_error == "fail":
        raise InputError(f"input {path}: {what} [{reason}]. Fix or remove the file, or pass --on-error skip.")
    log.warning("skipping input %s: %s", path, what)
    if report is not None:
        report.bad_files[path] = reason


def _bad_record(opts: ReadOptions, report: ReadReport, unit: Unit, offset: int, lineno: int | None,
                reason: str, what: str, fix: str = "Fix the record or pass --on-error skip.") -> None:
    if opts.on_error == "fail":
        where = f"line {lineno} (byte offset {offset})" if lineno is not None else f"byte offset {offset}"
        raise InputError(f"input {redact_url(unit.path)}, {where}: {what} [{reason}]. {fix}")
    report.dropped[reason] += 1


def read_unit(unit: Unit, opts: ReadOptions, endpoint_url: str | None = None,
              report: ReadReport | None = None) -> Iterator[Doc]:
    """The documents of one unit, in file order. Dropped records go to ``report``."""
    report = report if report is not None else ReadReport()
    fs, path = filesystem_for(unit.data or unit.path, endpoint_url)
    try:
        if unit.fmt == "parquet":
            yield from _parquet_docs(fs, path, unit, opts, report)
            return
        compression = compression_of(path)
        remote = compression is None and is_url(unit.data or unit.path)
        with (Ranged(fs, path, unit.start, unit.end, unit.base, _CONTEXT if unit.fmt == "text" else 1) if remote
              else fs.open(path, "rb", compression=compression)) as f:
            if unit.fmt == "jsonl":
                yield from _jsonl_docs(f, unit, opts, report, seekable=compression is None)
            else:
                yield from _text_docs(f, unit, opts, report, seekable=compression is None)
    except InputError:
        raise
    except (EOFError, OSError, ValueError, RuntimeError) as e:
        if is_transient(e):  # throttled or cut off past the retries: the store's failure, loud, never skipped
            raise storage_error(unit.path, e, "read input") from e
        # Truncated gzip (EOFError), not-gzip/xz/zstd junk (OSError, LZMAError, ZstdError), corrupt Parquet.
        _bad_file(opts, report, unit.path, "corrupt_file", unreadable(e))
    except Exception as e:  # noqa: BLE001 - only a storage client's own errors (aiohttp's, botocore's) are caught
        if not type(e).__module__.startswith(STORAGE_CLIENTS):
            raise
        # The store failed us after the retries (an http 500, a refused read): not the file's fault, so not a bad
        # file to skip; one line naming the input (redacted) and the usual fix.
        raise storage_error(unit.path, e, "read input") from e


def unreadable(e: BaseException, text_bytes: int | None = None) -> str:
    """What a read error of a compressed or Parquet file says of the file (``text_bytes``: read before it)."""
    if isinstance(e, EOFError):  # gzip/bz2/xz/zstd: the stream stops before its end marker
        at = f", {text_bytes:,} bytes of text in" if text_bytes else ""
        return (f"the file is cut short (its compressed stream ends before its end marker{at}: an interrupted "
                "download or copy?); fetch it again")
    return f"cannot be read to the end ({type(e).__name__}: {e})"


def _position(f: IO[bytes], pos: int, seekable: bool) -> None:
    """Move to ``pos`` bytes into the stream (decompressing and discarding when it cannot seek)."""
    if seekable:
        f.seek(pos)
        return
    left = pos
    while left > 0:
        got = f.read(min(_CHUNK, left))
        if not got:
            break
        left -= len(got)


def _lines(f: IO[bytes], pos: int, max_line: int, start: int = 0, end: int | None = None
           ) -> Iterator[tuple[int, bytes | None]]:
    """(offset, line with its newline) from ``pos``; a line longer than ``max_line`` (without its newline) comes as
    None and is never held whole.

    A line that begins before ``start`` and runs to ``end`` means no line starts in [start, end): stop, or every
    unit inside a 100 MB line would read to its end (quadratic work).
    """
    pending: list[bytes] = []  # pieces of the current line (a list: joining once beats repeated concatenation)
    plen, skipping = 0, False
    while True:
        data = f.read(_CHUNK)
        if not data:
            if skipping or pending:
                yield pos, (None if skipping else b"".join(pending))
            return
        i = 0
        while (j := data.find(b"\n", i)) >= 0:
            # Over-long by its length alone, not by where the read chunks fall: otherwise a long whitespace line
            # would be blank or not depending on the unit's start (and the pieces' cuts).
            if skipping or plen + j - i > max_line:
                yield pos, None
            elif pending:
                yield pos, b"".join(pending) + data[i:j + 1]
            else:
                yield pos, data[i:j + 1]
            pos += plen + j + 1 - i
            pending, plen, skipping, i = [], 0, False, j + 1
        rest = len(data) - i
        if rest:
            plen += rest
            if end is not None and pos < start and pos + plen >= end:
                return
            if not skipping:
                pending.append(data[i:])
                if plen > max_line:
                    pending, skipping = [], True


def _decode(line: bytes) -> tuple[str | None, str | None]:
    """(text, None) or (None, reason)."""
    if b"\x00" in line:
        return None, "binary"
    try:
        return line.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, "undecodable"


_WHAT = {
    "binary": "NUL bytes (binary data, not text)",
    "undecodable": "bytes that are not UTF-8",
    "record_too_long": "a record longer than max_record_bytes",
    "bad_json": "not valid JSON",
}


def _text_docs(f: IO[bytes], unit: Unit, opts: ReadOptions, report: ReadReport, seekable: bool) -> Iterator[Doc]:
    s, e = unit.start, unit.end
    base = max(unit.base, s - _CONTEXT)
    _position(f, base - unit.base, seekable)
    prev_blank = True  # the file start counts as a separator (a piece starts at one)
    lineno = 0 if s == 0 else None
    doc: Doc | None = None
    size, bad, bad_off, bad_line = 0, None, 0, None
    for off, line in _lines(f, base, opts.max_record_bytes, s, e):
        if lineno is not None:
            lineno += 1
        blank = line is not None and not line.strip()
        if off < s:  # context before the unit: only tells whether the next line starts a document
            prev_blank = blank
            continue
        if blank:
            if doc is not None:
                if bad:
                    _bad_record(opts, report, unit, bad_off, bad_line, bad, _WHAT[bad])
                elif doc.lines:
                    yield doc
                doc = None
            prev_blank = True
            continue
        if prev_blank:
            if e is not None and off >= e:
                break
            doc, size, bad = Doc(f"{unit.key}:{off}", []), 0, None
        prev_blank = False
        if doc is None or bad:  # the tail of a document owned by the previous unit, or already bad
            continue
        if line is None or size + len(line) > opts.max_record_bytes:
            bad, bad_off, bad_line = "record_too_long", off, lineno
            doc.lines = []
            continue
        text, reason = _decode(line)
        if reason:
            bad, bad_off, bad_line = reason, off, lineno
            doc.lines = []
            continue
        size += len(line)
        doc.lines.append(text.strip())
    if doc is not None:
        if bad:
            _bad_record(opts, report, unit, bad_off, bad_line, bad, _WHAT[bad])
        elif doc.lines:
            yield doc


def _id(own: object, position: str) -> str:
    """The record's own id (a string or an integer), else its position in the file."""
    if isinstance(own, str) and own:
        return own
    if isinstance(own, int) and not isinstance(own, bool):
        return str(own)
    return position


def _missing_field(rec: object, field: str) -> tuple[str, str, str]:
    """(what is wrong, how to fix it, what the record holds) for a JSON record without a string ``field``: the
    fields it has, so that a corpus keyed ``body`` or ``content`` is one flag away."""
    if not isinstance(rec, dict):
        has = f"a JSON {type(rec).__name__}, not an object"
        return (f"{has} with a {field!r} field",
                "Each line must be an object holding the text; fix the file or pass --on-error skip.", has)
    fields = ", ".join(repr(k) for k in list(rec)[:12]) + (", ..." if len(rec) > 12 else "")
    has = f"fields {fields}" if rec else "no fields"
    return (f"no string {field!r} field (the record has {has})",
            "Pass --text-field NAME to read the text from another field, or --on-error skip to drop such records.",
            has)


def _jsonl_docs(f: IO[bytes], unit: Unit, opts: ReadOptions, report: ReadReport, seekable: bool) -> Iterator[Doc]:
    s, e = unit.start, unit.end
    base = max(unit.base, s - 1)  # a line starting exactly at s has its newline at s-1 (a piece starts at a line)
    _position(f, base - unit.base, seekable)
    lineno = 0 if s == 0 else None
    missing, first_missing = 0, ""
    for off, line in _lines(f, base, opts.max_record_bytes, s, e):
        if lineno is not None:
            lineno += 1
        if off < s:
            continue
        if e is not None and off >= e:
            break
        if line is not None and not line.strip():
            continue
        reason = "record_too_long" if line is None else None
        text = None
        if reason is None:
            raw, reason = _decode(line)
        if reason is None:
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                reason = "bad_json"
            else:
                text = rec.get(opts.text_field) if isinstance(rec, dict) else None
                own = rec.get(opts.id_field) if opts.id_field and isinstance(rec, dict) else None
                if not isinstance(text, str):
                    what, fix, has = _missing_field(rec, opts.text_field)
                    missing += 1
                    first_missing = first_missing or has
                    _bad_record(opts, report, unit, off, lineno, "missing_text_field", what, fix)
                    continue
        if reason:
            _bad_record(opts, report, unit, off, lineno, reason, _WHAT[reason])
            continue
        yield Doc(_id(own, f"{unit.key}:{off}"), text.split("\n") if opts.presplit else [text])
    if missing:  # skipped as asked, but a wrong --text-field drops everything: say what the records hold
        log.warning("input %s: dropped %d record(s) without a string %r field (the first has %s); pass"
                    " --text-field NAME if the text is in another field", unit.path, missing, opts.text_field,
                    first_missing)


def _parquet_docs(fs, path: str, unit: Unit, opts: ReadOptions, report: ReadReport) -> Iterator[Doc]:
    with fs.open(path, "rb") as fh:
        pf = pq.ParquetFile(fh)
        if opts.text_field not in pf.schema_arrow.names:
            _bad_file(opts, report, unit.path, "missing_text_column",
                      f"no column {opts.text_field!r} (columns: {pf.schema_arrow.names}); pass --text-field")
            return
        first = sum(pf.metadata.row_group(g).num_rows for g in range(unit.start))
        has_id = bool(opts.id_field) and opts.id_field in pf.schema_arrow.names and opts.id_field != opts.text_field
        group = pf.read_row_group(unit.start, columns=[opts.text_field] + ([opts.id_field] if has_id else []))
        column = group.column(opts.text_field).to_pylist()
        ids = group.column(opts.id_field).to_pylist() if has_id else [None] * len(column)
    for i, (text, own) in enumerate(zip(column, ids, strict=False)):
        if not isinstance(text, str):
            _bad_record(opts, report, unit, first + i, None, "missing_text_field", f"row {first + i}: null text")
            continue
        yield Doc(_id(own, f"{unit.key}:{first + i}"), text.split("\n") if opts.presplit else [text])
