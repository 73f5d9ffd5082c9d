"""The heads of a build's inputs, read before any work: the text bytes of each document that starts in the first
MiB of up to SAMPLED_FILES inputs (Parquet: its footer), what they tell of the documents (plain text with no
blank line: one huge "document"), of the instances the inputs make (an estimate), and of files that are not what
their names say. Used by ``pipeline.preflight``.
"""
from __future__ import annotations

import codecs
import dataclasses
import json
import logging
import posixpath

import pyarrow.parquet as pq
from fsspec.compression import compr

from corpus.readers import STORAGE_CLIENTS, ReadOptions, input_format
from storage.fs import FileInfo, compression_of, filesystem_for, map_threads
from storage.redact import redact_url

log = logging.getLogger(__name__)

HEAD_BYTES = 1 << 20  # of each sampled input, decompressed
# How a compressed head is fetched: in requests of the decompressor's read plus this much (fsspec's read-ahead
# cache), so that the store sends about the compressed bytes the head needs. The client's default block (5 MiB over
# http, 50 MiB on S3) sent 6 MiB over http and ~51 MiB on S3 to sample one MiB.
HEAD_READ_AHEAD = 16 << 10
FOOTER_READ_AHEAD = 64 << 10  # a Parquet footer: its last 8 bytes, then its metadata
SAMPLED_FILES = 16  # inputs sampled (spread over the sorted list): a second of reads, whatever the corpus's size
# Plain text holding no blank line in its first MiB: one "document" of at least this size. BERT's pairs are drawn
# within a document and its random next sentences from other documents: a corpus of a few such documents gives NSP
# negatives from the same text. A long novel is ~1 MB of text, and its paragraphs are separated by blank lines.
MAX_DOCUMENT_BYTES = HEAD_BYTES
BYTES_PER_TOKEN = 4.3  # English WordPiece (bert-base-uncased on our corpora: 4.2-4.5 bytes of text per token)
# A document's tokens per instance, as a share of the target length: a random-next instance takes only its A segment
# from the document (about half the chunk; the rest is put back), and half the instances are random-next.
CONSUMED = 0.75


@dataclasses.dataclass(frozen=True)
class Sample:
    """What the head of one input holds (for Parquet, what its footer says of the whole file)."""

    path: str
    """The input's URL."""
    size: int
    """The input's stored size in bytes (compressed, if it is)."""
    fmt: str
    """The input's format: ``text``, ``jsonl`` or ``parquet``."""
    bytes: int
    """Decompressed bytes of the head read, whole lines only (at most HEAD_BYTES, 1 MiB); for Parquet, the text
    column's uncompressed bytes over the whole file."""
    documents: int
    """Documents that start in the head (for Parquet, the file's rows)."""
    whole: bool
    """Whether the head is the whole file, so that nothing has to be scaled up from it (always True for Parquet)."""
    listed: int
    """Stored bytes the head was read from (the decompressor's position; the file's size when ``whole``): what
    the estimate scales to ``size`` by."""
    doc_bytes: tuple[int, ...] = ()
    """Text bytes of each document in the head; empty for Parquet."""
    first_document: int | None = None
    """Plain text only: bytes before the first blank line; None when the head holds no blank line (one document
    longer than MAX_DOCUMENT_BYTES, unless the head is the whole file)."""


def _parquet_head(f: FileInfo, fmt: str, read: ReadOptions, fs, path: str) -> Sample:
    try:
        with fs.open(path, "rb", block_size=FOOTER_READ_AHEAD, cache_type="readahead") as fh:
            meta = pq.ParquetFile(fh).metadata
    except Exception as e:  # noqa: BLE001 - the build names a bad Parquet file (readers.plan_units)
        log.debug("preflight: %s: %s", f.path, e)
        return Sample(f.path, f.size, fmt, 0, 0, True, f.size)
    groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
    text = sum(g.column(c).total_uncompressed_size for g in groups for c in range(g.num_columns)
               if g.column(c).path_in_schema == read.text_field)
    return Sample(f.path, f.size, fmt, text, meta.num_rows, True, f.size)


def _documents(lines: list[bytes], fmt: str, text_field: str) -> tuple[list[int], int | None]:
    """The text bytes of each document in whole lines, and (plain text) where the first blank line is."""
    if fmt == "jsonl":
        sizes = []
        for line in lines:
            try:
                text = json.loads(line).get(text_field) if line.strip() else None
            except (ValueError, AttributeError):  # the build names a bad record; here it only counts
                text = None
            if isinstance(text, str):
                sizes.append(len(text.encode("utf-8")))
        return sizes, None
    sizes, current, first, offset = [], None, None, 0
    for line in lines:
        if not line.strip():
            if current is not None:
                sizes.append(current)
                first = offset if first is None else first
            current = None
        else:
            current = (current or 0) + len(line) + 1
        offset += len(line) + 1
    if current is not None:
        sizes.append(current)
    return sizes, first


def _head(f: FileInfo, read: ReadOptions, endpoint_url: str | None) -> Sample | None:
    fmt = input_format(f.path, read.fmt)
    fs, path = filesystem_for(f.path, endpoint_url)
    if fmt == "parquet":
        return _parquet_head(f, fmt, read, fs, path)
    compression = compression_of(path)
    try:
        if compression:
            with fs.open(path, "rb", block_size=HEAD_READ_AHEAD, cache_type="readahead") as raw:
                head = compr[compression](raw, mode="rb").read(HEAD_BYTES + 1)
                listed = raw.tell()  # what the decompressor took of the stored bytes (it reads ahead a little)
        else:  # exactly the head's bytes, in one request
            head = fs.cat_file(path, start=0, end=HEAD_BYTES + 1)
            listed = len(head)
    except Exception as e:  # noqa: BLE001 - sorted below: the store's failure, or the file's
        if type(e).__module__.startswith(STORAGE_CLIENTS):
            # The store failed us: the build reads the file with its retries, and names it if that fails too.
            log.debug("preflight: could not read the head of %s: %s", redact_url(f.path), e)
            return None
        if isinstance(e, (EOFError, OSError, ValueError, RuntimeError)):  # the decompressor's: the file's fault
            raise ValueError(_unreadable(f, compression, e, endpoint_url)) from e
        raise
    whole = len(head) <= HEAD_BYTES
    if not whole:  # whole lines only: the last document of the head is cut, and counted as it is
        head = head[:HEAD_BYTES]
        head = head[:head.rfind(b"\n") + 1] or head
    lines = head.split(b"\n")
    if lines[-1] == b"":  # the newline that ends the last line
        lines.pop()
    sizes, first = _documents(lines, fmt, read.text_field)
    if whole and first is None and len(sizes) == 1:
        first = sizes[0]
    return Sample(f.path, f.size, fmt, len(head), len(sizes), whole, f.size if whole else min(f.size, listed),
                  tuple(sizes), first)


_MAGIC = {"gzip": b"\x1f\x8b", "bz2": b"BZh", "xz": b"\xfd7zXZ\x00", "zstd": b"\x28\xb5\x2f\xfd"}


def _looks_like_text(data: bytes) -> bool:
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except UnicodeDecodeError:
        return False
    return bool(text) and all(c.isprintable() or c in "\t\r\n\ufeff" for c in text)


def _unreadable(f: FileInfo, compression: str | None, e: BaseException, endpoint_url: str | None) -> str:
    """The one line for an input whose first bytes cannot be read: cut short, or not what its name says."""
    shown = redact_url(f.path)
    if not compression:
        return f"input {shown}: cannot be read ({type(e).__name__}: {e}); fix or remove the file"
    fs, path = filesystem_for(f.path, endpoint_url)
    try:
        with fs.open(path, "rb") as raw:
            first = raw.read(8)
    except Exception:  # noqa: BLE001 - the store's failure: say what the decompressor said
        first = None
    suffix = posixpath.splitext(path)[1]
    if first is not None and not first.startswith(_MAGIC[compression]):
        what = "text" if _looks_like_text(first) else f"bytes {first[:4].hex(' ')}"
        return (f"input {shown}: not a {compression} file, though its name ends in {suffix} (it starts with {what}): "
                f"rename it to what it holds (without {suffix} for plain text), or compress it")
    if isinstance(e, EOFError):
        return (f"input {shown}: the {compression} stream ends before its end marker, {f.size:,} bytes in: the file is "
                "cut short (an interrupted download or copy?); fetch it again, or pass --on-error skip to build "
                "without it")
    return (f"input {shown}: a corrupt {compression} stream ({type(e).__name__}: {e}); fetch it again, or pass "
            "--on-error skip to build without it")


def sample_inputs(files: list[FileInfo], read: ReadOptions, endpoint_url: str | None = None) -> list[Sample]:
    """The heads of up to SAMPLED_FILES inputs, spread over the list (all of them when there are fewer), read in
    parallel. A compressed input that cannot be decompressed is a ValueError naming it (left to the build with
    ``on_error="skip"``)."""
    step = max(1, len(files) / SAMPLED_FILES)
    picked = [files[int(i * step)] for i in range(min(len(files), SAMPLED_FILES))]

    def head(f: FileInfo) -> Sample | None:
        try:
            return _head(f, read, endpoint_url)
        except ValueError:
            if read.on_error == "skip":  # the build skips and counts it, as asked
                return None
            raise

    return [s for s in map_threads(head, [f for f in picked if f.size]) if s is not None]


def check_documents(samples: list[Sample]) -> None:
    """Refuse plain text whose first document runs past MAX_DOCUMENT_BYTES (no blank line to end it)."""
    for s in samples:
        if s.fmt != "text":
            continue
        if s.first_document is None and not s.whole:
            raise ValueError(
                f"input {redact_url(s.path)}: its first {MAX_DOCUMENT_BYTES >> 20} MiB of text hold no blank line, so "
                "it reads as one document of more than a MiB (plain text separates documents by blank lines, and "
                "BERT's random next sentences come from other documents): put a blank line between documents, "
                "or give one document per record as JSON Lines ({\"text\": ...} per line, --format jsonl)")


def estimate_instances(samples: list[Sample], files: list[FileInfo], max_seq_length: int, short_seq_prob: float,
                       dupe_factor: int) -> int | None:
    """About how many instances the inputs make: a document of T tokens gives about T / (CONSUMED * target) + 1/2
    instances per pass, and at least one (target: the reference's mean target length; the half: its last, short
    chunk), summed over each sampled head, scaled from the stored bytes the head came from to the file's size, and
    from the sampled files to all the inputs. None when nothing could be sampled."""
    usable = [s for s in samples if s.documents and s.listed]
    if not usable:
        return None
    target = (1 - short_seq_prob) * (max_seq_length - 3) + short_seq_prob * (max_seq_length - 1) / 2

    def per_pass(s: Sample) -> float:
        sizes = s.doc_bytes or (s.bytes / s.documents,) * s.documents  # Parquet: the mean row
        return sum(max(1.0, b / BYTES_PER_TOKEN / (CONSUMED * target) + 0.5) for b in sizes) * s.size / s.listed

    per_byte = sum(per_pass(s) for s in usable) / sum(s.size for s in usable)
    return max(1, round(per_byte * sum(f.size for f in files) * dupe_factor))
