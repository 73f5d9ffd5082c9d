"""The pieces step: a big compressed input -> pieces of about one unit, so that it is read in parallel and in
bounded memory.

A compressed stream cannot seek, so a unit in the middle of a ``.gz`` would decompress everything before it, and
one unit per file holds the whole file. Instead, one item per compressed file bigger than about one unit streams
it ONCE through a fixed-size buffer and commits pieces of about ``unit_bytes`` of decompressed data, each cut at a
document boundary (after a blank line for text, after a newline for JSON Lines), then a completion marker listing
them. The docs stage reads each piece as an ordinary unit whose ``base`` is the piece's offset in the decompressed
input: documents keep the ids (``<key>:<decompressed offset>``) they have in the same text uncompressed, so the
dataset is byte-identical whether the input was compressed or not, and does not depend on ``unit_bytes``.

    plan_pieces(files, opts, unit_bytes, endpoint_url) -> [PieceItem]   which files need the step (metadata only)
    pieces_step(item, ctx) -> PieceMarker (PiecesStep(ctx): a step)     one item per file: stream, cut, commit
    input_units(files, read, unit_bytes, work, executor, report) -> [Unit]   every unit, the pieces cut by the executor
    pieces_stage(state) -> Stage                                         the build's stage; its hook sets the units

Pieces are written with zstd level 1 (``<file index>-<piece>.zst`` under ``_work/pieces``): measured on 11.8 MB of
text here, 181 MB/s to compress and 430 MB/s to read back (under 2% of the ~3 MB/s per CPU that tokenizing costs)
for 2.5x less _work space and traffic than plain pieces, which matters when _work is on S3.

Resume: a file whose marker exists is not redone; a file without one is redone from the start, overwriting leftover
pieces (each piece is committed atomically, so none is ever half-written).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import socket
from typing import Any

from corpus.readers import InputError, ReadOptions, ReadReport, Unit, input_format, plan_units, unreadable
from pipeline.executor import Executor, Stage, run_stage
from pipeline.markers import Marker, marker, write_marker
from pipeline.sizes import COMPRESSED_RATIO
from pipeline.state import BuildState
from storage.fs import (
    FileInfo,
    compression_of,
    filesystem_for,
    join,
    map_threads,
    open_atomic,
    storage_error,
    write_bytes_atomic,
)
from storage.redact import redact_url
from storage.retry import is_transient

log = logging.getLogger(__name__)

PIECES_DIR = "pieces"
CHUNK = 256 << 10  # decompressed bytes held at once, whatever the file's size (a read that hits a corrupt
# stream loses what it decompressed: small reads keep more of a broken file, as the readers do)
# Without a size from the file, its decompressed size is guessed generously (text compresses 3-10x): a file that
# needs no pieces but gets them only costs one small item, one that needs them but does not gets one huge unit.
MAX_RATIO = 10
# A compressed input is fetched in requests of the decompressor's read plus this much (fsspec's read-ahead cache:
# each request starts where the last ended), so the store sends it once. The client's default (BytesCache, 5 MiB
# blocks over http) re-fetched overlapping ranges: 1.61x the file's bytes.
READ_AHEAD = 4 << 20
# A blank line longer than this is not taken as a cut: the reader sees a whitespace-only line of at most 1 KiB as
# blank whatever its chunking and --max-record-bytes (>= 1 KiB), so both readings agree on where documents start.
_MAX_BLANK = 1024
_WS = b" \t\n\r\x0b\x0c"  # what bytes.strip() removes: the reader's notion of a blank line
_BLANK = re.compile(rb"\n[ \t\r\x0b\x0c]*\n")  # the end of a line, then a whitespace-only line


@dataclasses.dataclass(frozen=True)
class PieceItem:
    """One compressed input to cut: its index among the planned files (uids and piece names use it)."""

    index: int
    """The file's index among the planned input files: its marker's name and its pieces' names start with it."""
    path: str
    """The input's URL."""
    key: str
    """The input's key in document ids (``FileInfo.key``)."""
    fmt: str
    """The input's format as the readers name it (``text`` or ``jsonl``: Parquet is never cut)."""


@dataclasses.dataclass(frozen=True)
class PieceContext:
    """What the pieces step needs: where to write, how big a piece is, how to treat a broken input."""

    work: str
    """URL of the build's _work folder; pieces go under ``<work>/pieces``."""
    unit_bytes: int
    """Decompressed bytes per piece (the build's unit size): piece k holds the documents that start in
    [k * unit_bytes, (k + 1) * unit_bytes) of the decompressed input, exactly unit k of the same text uncompressed."""
    read: ReadOptions
    """The readers' options; ``on_error`` decides whether a corrupt or empty input fails the build or is skipped."""
    endpoint_url: str | None = None
    """S3-compatible endpoint for s3:// URLs (MinIO, Ceph); None: AWS's own."""
    fence: Any = None
    """The output's writer lease (storage/fence.py), proved before each marker is committed; None: no lease."""

    def url(self, *parts: str) -> str:
        return join(self.work, PIECES_DIR, *parts)


@marker(PIECES_DIR)
class PieceMarker(Marker):
    """What a finished pieces item committed: ``pieces`` as (name, start, end) in the decompressed input, and what
    bounded its memory (the largest buffer held, the largest piece, the item's RSS growth; None off Linux).
    Committed as ``<work>/pieces/<key>.done.json``."""


    index: int
    """The file's index among the planned input files (the marker's name)."""
    path: str
    """The input's redacted URL (no userinfo, no signature): the marker lives in the output folder."""
    file_key: str
    """The input's key in document ids."""
    fmt: str
    """The input's format (``text`` or ``jsonl``)."""
    pieces: tuple[tuple[str, int, int], ...]
    """(file name under ``<work>/pieces``, start, end) of each piece, in bytes of the decompressed input."""
    decompressed_bytes: int
    """Bytes the input decompressed to (up to the break, for a corrupt one)."""
    largest_piece_bytes: int
    """Decompressed bytes of the largest piece: one document longer than a unit makes it bigger than ``unit_bytes``."""
    buffer_bytes: int
    """The largest chunk of decompressed data held at once (at most ``CHUNK``, 256 KiB), whatever the file's size."""
    rss_growth_bytes: int | None
    """How far the process's resident memory grew while it cut the file, in bytes; None off Linux (no /proc)."""
    bad_files: dict[str, str]
    """{redacted URL: ``corrupt_file`` or ``empty_file``} of an input skipped in part or whole (--on-error skip)."""
    worker: str = ""
    """``host:pid`` of the process that cut the file, for debugging (the driver should never appear here)."""


def _decompressed_size(f: FileInfo, endpoint_url: str | None) -> int | None:
    """A gzip file's decompressed size from its trailer (ISIZE: the size mod 2**32 of its last member), when that
    is plausible (at least the compressed size); None otherwise. Reads 4 bytes: metadata, not corpus."""
    if compression_of(f.path) != "gzip" or f.size < 18:
        return None
    try:
        fs, path = filesystem_for(f.path, endpoint_url)
        with fs.open(path, "rb", block_size=4096) as fh:
            fh.seek(f.size - 4)
            isize = int.from_bytes(fh.read(4), "little")
    except (OSError, ValueError):
        return None  # unreadable: the pieces step reports it, naming the file
    return isize if isize >= f.size else None


def needs_pieces(f: FileInfo, fmt: str, unit_bytes: int, decompressed: int | None) -> bool:
    """A compressed text/JSON Lines file bigger than about one unit once decompressed."""
    if fmt == "parquet" or not compression_of(f.path) or f.size == 0:
        return False
    return (decompressed if decompressed is not None else f.size * MAX_RATIO) > unit_bytes


def plan_pieces(files: list[FileInfo], opts: ReadOptions, unit_bytes: int,
                endpoint_url: str | None = None) -> list[PieceItem]:
    """The files the pieces step must cut, from metadata only: sizes from the listing, and gzip trailers (read in
    parallel) for the compressed files small enough that their size decides."""
    fmts = [input_format(f.path, opts.fmt) for f in files]
    probe = [i for i, f in enumerate(files)
             if fmts[i] != "parquet" and compression_of(f.path) and 0 < f.size <= unit_bytes]
    sizes = dict(zip(probe, map_threads(lambda i: _decompressed_size(files[i], endpoint_url), probe), strict=False))
    return [PieceItem(i, f.path, f.key, fmts[i]) for i, f in enumerate(files)
            if needs_pieces(f, fmts[i], unit_bytes, sizes.get(i))]


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


class _Cutter:
    """Finds document boundaries in a stream fed chunk by chunk (the state of the current line carries over)."""

    def __init__(self, fmt: str):
        self.text = fmt != "jsonl"
        self.line_len = 0  # bytes of the current (unfinished) line so far
        self.line_ws = True  # whether they are all whitespace

    def cut(self, data: memoryview, frm: int) -> int | None:
        """The first boundary at or after ``frm`` in ``data`` (the index just past it), or None. Does not advance
        the line state: call ``advance`` with what was consumed."""
        raw = data.obj if isinstance(data.obj, bytes) and len(data.obj) == len(data) else bytes(data)
        if not self.text:
            j = raw.find(b"\n", frm)
            return None if j < 0 else j + 1
        # The line that holds position frm: is it blank (from its start, maybe in an earlier chunk)?
        j = raw.find(b"\n", frm)
        if j < 0:
            return None
        k = raw.rfind(b"\n", 0, frm)
        if k >= 0:
            length, ws = j - k, not raw[k + 1:j].strip(_WS)
        else:
            length, ws = self.line_len + j + 1, self.line_ws and not raw[:j].strip(_WS)
        if ws and length <= _MAX_BLANK:
            return j + 1
        # Then the next short blank line, found by a regex (a long run of lines without one costs no Python loop).
        while m := _BLANK.search(raw, j):
            if m.end() - m.start() - 1 <= _MAX_BLANK:
                return m.end()
            j = m.end() - 1
        return None

    def advance(self, data: memoryview) -> None:
        raw = bytes(data) if not isinstance(data.obj, bytes) or len(data.obj) != len(data) else data.obj
        k = raw.rfind(b"\n")
        if k >= 0:
            self.line_len, self.line_ws = len(raw) - k - 1, not raw[k + 1:].strip(_WS)
        else:
            self.line_len += len(raw)
            self.line_ws = self.line_ws and not raw.strip(_WS)


class _PieceWriter:
    """One piece being written: zstd level 1 into an atomic commit."""

    def __init__(self, url: str, endpoint_url: str | None):
        import zstandard

        self._stack = contextlib.ExitStack()
        f = self._stack.enter_context(open_atomic(url, endpoint_url))
        self._z = self._stack.enter_context(zstandard.ZstdCompressor(level=1).stream_writer(f, closefd=False))
        self.size = 0

    def write(self, data: memoryview) -> None:
        self._z.write(data)
        self.size += len(data)

    def commit(self) -> None:
        self._stack.close()

    def discard(self, e: BaseException) -> None:
        self._stack.__exit__(type(e), e, e.__traceback__)


class _Corrupt(Exception):
    """The input could not be decompressed to the end (its cause says why)."""


def _read(f, path: str) -> bytes:
    try:
        return f.read(CHUNK)
    except (EOFError, OSError, ValueError, RuntimeError) as e:
        if is_transient(e):  # throttled or cut off past the retries: the store's failure, never a corrupt file
            raise storage_error(path, e, "read input") from e
        # Truncated gzip (EOFError), not-gzip/xz/zstd junk (OSError, LZMAError, ZstdError). Write errors are not
        # caught here: a failing _work is not a corrupt input.
        raise _Corrupt() from e


def _discard(writer: _PieceWriter | None, e: BaseException) -> None:
    if writer is not None:
        with contextlib.suppress(Exception):
            writer.discard(e)
    return None


def _keep_complete_documents(url: str, fmt: str, endpoint_url: str | None) -> int:
    """Cut a committed piece back to its last document boundary (the input broke off inside a document); the
    bytes kept, 0 if none (the piece is then removed). Rare path: the piece (about one unit) is read whole."""
    import zstandard

    fs, path = filesystem_for(url, endpoint_url)
    data = zstandard.ZstdDecompressor().stream_reader(fs.cat_file(path)).read()
    view, cutter, last = memoryview(data), _Cutter(fmt), 0
    while (c := cutter.cut(view, last)) is not None:
        last = c
    if last:
        write_bytes_atomic(url, zstandard.ZstdCompressor(level=1).compress(data[:last]), endpoint_url)
    else:
        fs.rm_file(path)
    return last


def pieces_step(item: PieceItem, ctx: PieceContext) -> PieceMarker:
    """Stream one compressed input once and commit it as pieces of about ``unit_bytes`` cut at document
    boundaries, then the marker. Memory: one ``CHUNK`` of decompressed data and the compressor's state."""
    rss0 = _rss()
    rss_peak = rss0
    pieces: list[tuple[str, int, int]] = []
    bad: dict[str, str] = {}
    shown = redact_url(item.path)  # in messages and in the marker (the output folder): no userinfo, no signature
    cutter = _Cutter(item.fmt)
    pos = 0  # decompressed bytes consumed
    buffer = 0
    writer: _PieceWriter | None = None
    fs, path = filesystem_for(item.path, ctx.endpoint_url)

    def close_piece() -> None:
        nonlocal writer
        if writer is not None:
            name = f"{item.index:05d}-{len(pieces):05d}.zst"
            writer.commit()
            pieces.append((name, pos - writer.size, pos))
        writer = None

    def open_piece() -> _PieceWriter:
        # Piece k holds the documents that start in [k*U, (k+1)*U) of the decompressed input: exactly the
        # documents of unit k of the same text uncompressed, so the build's units (and its output) are the same.
        # A document longer than a unit leaves the pieces it spans empty, as it leaves those units empty.
        nonlocal writer
        while (len(pieces) + 1) * ctx.unit_bytes <= pos:
            writer = _PieceWriter(ctx.url(f"{item.index:05d}-{len(pieces):05d}.zst"), ctx.endpoint_url)
            close_piece()
        return _PieceWriter(ctx.url(f"{item.index:05d}-{len(pieces):05d}.zst"), ctx.endpoint_url)

    try:
        with fs.open(path, "rb", compression=compression_of(path), block_size=READ_AHEAD,
                     cache_type="readahead") as f:
            while chunk := _read(f, item.path):
                buffer = max(buffer, len(chunk))
                view = memoryview(chunk)
                while len(view):
                    if writer is None:
                        writer = open_piece()
                    want = (len(pieces) + 1) * ctx.unit_bytes - pos  # this piece's end, from the view's start
                    cut = cutter.cut(view, max(0, want)) if want < len(view) else None
                    take = view if cut is None else view[:cut]
                    writer.write(take)
                    pos += len(take)
                    if cut is None:
                        cutter.advance(take)
                        break
                    cutter.line_len, cutter.line_ws = 0, True  # a cut is always at a line start
                    close_piece()
                    view = view[cut:]
                del chunk, view
                rss = _rss()
                if rss is not None and rss_peak is not None:
                    rss_peak = max(rss_peak, rss)
        close_piece()
        while pos and len(pieces) < -(-pos // ctx.unit_bytes):  # as many as the plain text has units
            writer = _PieceWriter(ctx.url(f"{item.index:05d}-{len(pieces):05d}.zst"), ctx.endpoint_url)
            close_piece()
    except _Corrupt as e:
        what = unreadable(e.__cause__, pos)
        if ctx.read.on_error == "fail":
            _discard(writer, e)
            raise InputError(f"input {shown}: {what} [corrupt_file]. Fix or remove the file, or pass "
                             "--on-error skip.") from e
        if writer is not None:  # keep the documents read to the end, as reading the file directly would
            start, name = pos - writer.size, f"{item.index:05d}-{len(pieces):05d}.zst"
            writer.commit()
            writer = None
            kept = _keep_complete_documents(ctx.url(name), item.fmt, ctx.endpoint_url)
            if kept:
                pieces.append((name, start, start + kept))
        log.warning("input %s: %s: keeping the %d pieces read before", shown, what, len(pieces))
        bad[shown] = "corrupt_file"
    except BaseException as e:  # a failed write, a kill: no piece is left half-written
        _discard(writer, e)
        raise
    if pos == 0 and not bad:
        if ctx.read.on_error == "fail":
            raise InputError(f"input {shown}: no data after decompression [empty_file]. Fix or remove the "
                             "file, or pass --on-error skip.")
        bad[shown] = "empty_file"
    marker = PieceMarker(
        index=item.index, path=shown, file_key=item.key, fmt=item.fmt, pieces=tuple(pieces), decompressed_bytes=pos,
        largest_piece_bytes=max((e - s for _, s, e in pieces), default=0), buffer_bytes=buffer,
        rss_growth_bytes=None if rss0 is None else rss_peak - rss0, bad_files=bad, worker=worker_id())
    write_marker(ctx.work, marker, ctx.endpoint_url, ctx.fence)
    return marker


@dataclasses.dataclass(frozen=True)
class PiecesStep:
    ctx: PieceContext
    """Where the pieces go, their size, and the error policy: the same for every item."""

    def __call__(self, item: PieceItem) -> PieceMarker:  # pieces_step as a picklable step of one argument
        return pieces_step(item, self.ctx)


def piece_units(markers: list[PieceMarker], ctx: PieceContext) -> list[Unit]:
    """Docs-stage units of the pieces: uid ``<file index>-<piece>``, offsets in the decompressed input."""
    return [Unit(f"{m.index:05d}-{k:05d}", m.path, m.file_key, m.fmt, start, end, data=ctx.url(name), base=start)
            for m in sorted(markers, key=lambda m: m.index) for k, (name, start, end) in enumerate(m.pieces)]


def input_units(files: list[FileInfo], read: ReadOptions, unit_bytes: int, work: str, executor: Executor,
                report: ReadReport, endpoint_url: str | None = None, fence: Any = None) -> list[Unit]:
    """Every unit of the inputs, in uid order: big compressed inputs are first cut into unit-sized pieces under
    ``work`` (one item per file, streaming it once, so memory per item stays bounded and the docs stage is parallel
    over the pieces); the rest are planned from metadata."""
    stage, ctx = _stage(files, read, unit_bytes, work, endpoint_url, fence)
    return _units(files, read, unit_bytes, ctx, stage, run_stage(stage, executor, work, endpoint_url), report)


def _stage(files: list[FileInfo], read: ReadOptions, unit_bytes: int, work: str,
           endpoint_url: str | None, fence: Any = None) -> tuple[Stage, PieceContext]:
    ctx = PieceContext(work, unit_bytes, read, endpoint_url, fence)
    items = plan_pieces(files, read, unit_bytes, endpoint_url)
    return (Stage("pieces", PiecesStep(ctx), {f"{t.index:05d}": t for t in items}, PieceMarker,
                  noun="compressed files"), ctx)


def _units(files: list[FileInfo], read: ReadOptions, unit_bytes: int, ctx: PieceContext, stage: Stage,
           markers: list, report: ReadReport) -> list[Unit]:
    for m in markers:
        report.bad_files.update(m.bad_files)
    units = plan_units(files, read, unit_bytes, ctx.endpoint_url, report,
                       exclude={t.path for t in stage.items.values()})
    return sorted(units + piece_units(markers, ctx), key=lambda u: u.uid)


def pieces_stage(s: BuildState) -> Stage | None:
    """The build's first stage: big compressed inputs cut into pieces; its hook plans every unit (``s.units``).
    A Dataset of documents has no files to cut: its units come from the Dataset (``ray_data/documents.py``)."""
    cfg = s.cfg
    stage, ctx = _stage(s.inputs.files, cfg.read, cfg.unit_bytes, cfg.work, cfg.endpoint_url, s.fence)
    if s.inputs.documents is not None:
        return None  # no files to cut; the units come from the Dataset once its read pass has run

    def after(st: BuildState) -> BuildState:
        report = ReadReport()  # the files the planning and the cutting skipped (--on-error skip), and why
        units = tuple(_units(st.inputs.files, cfg.read, cfg.unit_bytes, ctx, stage, st.markers["pieces"], report))
        return dataclasses.replace(st, units=units, report=report,
                                   unit_sizes=unit_sizes(list(units), st.inputs.files, COMPRESSED_RATIO))
    return dataclasses.replace(stage, after=after)


def unit_sizes(units: list[Unit], files: list[FileInfo], compressed_ratio: int) -> dict[str, int]:
    """Bytes of text per unit, for progress: a byte range's length (decompressed, for pieces); for a small
    compressed file or a Parquet row group, the stored size times ``compressed_ratio`` (the planning estimate)."""
    sizes = {f.path: f.size for f in files}
    groups: dict[str, int] = {}
    for u in units:
        groups[u.path] = groups.get(u.path, 0) + 1

    def size(u: Unit) -> int:
        if u.fmt == "parquet":
            return sizes.get(u.path, 0) * compressed_ratio // groups[u.path]
        if u.data is None and compression_of(u.path):
            return sizes.get(u.path, 0) * compressed_ratio
        return (u.end if u.end is not None else max(u.start, sizes.get(u.path, 0))) - u.start
    return {u.uid: size(u) for u in units}
