"""A shard's sidecar index: what a training worker needs to read only its own rows of a shard, and to prove that
what it read is what the build wrote.

    shards/part-00000-of-00016.parquet      the shard (corpus.schema.instance_schema)
    shards/part-00000-of-00016.index.npz    its index: ShardIndex.to_bytes()

The manifest's entry for the shard carries the sha256 of the whole file and of the index file; the index carries
every row's length (``len(input_ids)``: the window sort of pretraining/order.py needs only those), the byte span of
every Parquet row group's column chunks with its sha256, and the span and sha256 of the footer. A reader that
fetches the footer and a few row groups checks each span it fetched against the index before decoding it, so a
shard replaced after the build is refused whether it is read whole or in part.

The index is an ``.npz`` of plain arrays, read with ``allow_pickle=False``: whatever is read from storage is data.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import struct

import numpy as np
import pyarrow.parquet as pq

INDEX_SUFFIX = ".index.npz"
_PARQUET_SUFFIX = ".parquet"
_KEYS = ("lengths", "group_rows", "group_spans", "group_sha256", "footer_span", "footer_sha256", "file_bytes",
         "file_sha256")
_READ_BLOCK = 8 << 20


def index_name(shard_file: str) -> str:
    """The index's path beside ``shard_file`` (either may be relative to the dataset folder or a full URL)."""
    base = shard_file[: -len(_PARQUET_SUFFIX)] if shard_file.endswith(_PARQUET_SUFFIX) else shard_file
    return base + INDEX_SUFFIX


def _hex(value: str, what: str, where: str) -> str:
    if not isinstance(value, str) or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"{where}: {what} is not a sha256 hex digest; rebuild the dataset with jobs/build_dataset.py")
    return value


def verify_span(data: bytes, sha256: str, where: str) -> None:
    """Refuse ``data`` unless its sha256 is ``sha256``: the bytes were replaced after the build wrote them."""
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ValueError(f"{where}: sha256 {got[:12]}... differs from the {sha256[:12]}... the build recorded: the "
                         "file was replaced or damaged after the build; rebuild the dataset or restore the file")


@dataclasses.dataclass(frozen=True)
class ShardIndex:
    """One shard's rows and byte spans (see the module docstring)."""

    lengths: np.ndarray
    """Per row, in file order: ``len(input_ids)`` (tokens with [CLS] and [SEP]), uint16."""
    group_rows: np.ndarray
    """int64, rows per Parquet row group in file order; sums to ``len(lengths)``."""
    group_spans: np.ndarray
    """int64 (G, 2): ``[offset, size]`` of the bytes each row group's column chunks occupy in the file."""
    group_sha256: tuple[str, ...]
    """sha256 hex of each row group's span."""
    footer_span: tuple[int, int]
    """``(offset, size)`` of the Parquet footer: the metadata, its 4-byte length and the closing ``PAR1``."""
    footer_sha256: str
    """sha256 hex of the footer span."""
    file_bytes: int
    """The shard file's size."""
    file_sha256: str
    """sha256 hex of the whole shard file (the manifest's ``sha256`` for the shard)."""

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    def group_starts(self) -> np.ndarray:
        """int64 (G + 1,): the first row of each row group, then the row count."""
        starts = np.zeros(len(self.group_rows) + 1, np.int64)
        np.cumsum(self.group_rows, out=starts[1:])
        return starts

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, lengths=self.lengths, group_rows=self.group_rows, group_spans=self.group_spans,
                 group_sha256=np.array(self.group_sha256, dtype="S64").reshape(-1),
                 footer_span=np.array(self.footer_span, np.int64), footer_sha256=np.array(self.footer_sha256, "S64"),
                 file_bytes=np.array(self.file_bytes, np.int64), file_sha256=np.array(self.file_sha256, "S64"))
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, sha256: str | None, where: str) -> ShardIndex:
        """The index in ``data``, refused (ValueError naming ``where``) unless its sha256 is ``sha256`` (when given)
        and every array has the shape, type and range a shard's index has."""
        if sha256:
            verify_span(data, sha256, where)

        def bad(why: str) -> ValueError:
            return ValueError(f"{where}: not a shard index ({why}); rebuild the dataset with jobs/build_dataset.py")

        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                arrays = {k: z[k] for k in _KEYS}
        except (OSError, ValueError, KeyError, EOFError) as e:
            raise bad(f"{type(e).__name__}: {e}") from None
        lengths, rows, spans = arrays["lengths"], arrays["group_rows"], arrays["group_spans"]
        if lengths.ndim != 1 or lengths.dtype.kind != "u":
            raise bad("lengths must be one unsigned integer per row")
        if rows.ndim != 1 or rows.dtype != np.int64 or (rows < 0).any() or int(rows.sum()) != lengths.shape[0]:
            raise bad("group_rows must be int64 row counts summing to the rows")
        if spans.dtype != np.int64 or spans.shape != (rows.shape[0], 2) or (spans < 0).any():
            raise bad("group_spans must be one int64 [offset, size] per row group")
        digests = arrays["group_sha256"]
        if digests.dtype != np.dtype("S64") or digests.shape != (rows.shape[0],):
            raise bad("group_sha256 must be one digest per row group")
        footer = arrays["footer_span"]
        if footer.dtype != np.int64 or footer.shape != (2,) or (footer < 0).any():
            raise bad("footer_span must be [offset, size]")
        size = int(arrays["file_bytes"])
        ends = spans[:, 0] + spans[:, 1]
        if (ends > size).any() or int(footer[0] + footer[1]) != size or footer[1] < 12:
            raise bad("a span lies outside the file")
        return cls(lengths=lengths, group_rows=rows, group_spans=spans,
                   group_sha256=tuple(_hex(d.decode("ascii", "replace"), "a row group digest", where)
                                      for d in digests),
                   footer_span=(int(footer[0]), int(footer[1])),
                   footer_sha256=_hex(bytes(arrays["footer_sha256"]).decode("ascii", "replace"), "footer_sha256",
                                      where),
                   file_bytes=size,
                   file_sha256=_hex(bytes(arrays["file_sha256"]).decode("ascii", "replace"), "file_sha256", where))


def _spans(path: str) -> list[tuple[int, int]]:
    meta = pq.read_metadata(path)
    spans = []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        lo, hi = None, 0
        for c in range(rg.num_columns):
            col = rg.column(c)
            start = col.data_page_offset
            if col.has_dictionary_page and col.dictionary_page_offset is not None:
                start = min(start, col.dictionary_page_offset)
            lo = start if lo is None else min(lo, start)
            hi = max(hi, start + col.total_compressed_size)
        spans.append((lo or 0, hi - (lo or 0)))
    return spans


def index_parquet(path: str, lengths: np.ndarray) -> ShardIndex:
    """The index of the finished local Parquet file at ``path`` whose rows have ``lengths`` tokens each."""
    size = os.path.getsize(path)
    spans = _spans(path)
    with open(path, "rb") as f:
        f.seek(size - 8)
        tail = f.read(8)
        if len(tail) != 8 or tail[4:] != b"PAR1":
            raise ValueError(f"{path}: not a finished Parquet file")
        (meta_len,) = struct.unpack("<I", tail[:4])
        footer = (size - 8 - meta_len, meta_len + 8)
        whole = hashlib.sha256()
        f.seek(0)
        while block := f.read(_READ_BLOCK):
            whole.update(block)

        def digest(span: tuple[int, int]) -> str:
            f.seek(span[0])
            h = hashlib.sha256()
            left = span[1]
            while left:
                block = f.read(min(left, _READ_BLOCK))
                if not block:
                    raise ValueError(f"{path}: shorter than its metadata says")
                h.update(block)
                left -= len(block)
            return h.hexdigest()

        group_sha = tuple(digest(s) for s in spans)
        footer_sha = digest(footer)
    meta = pq.read_metadata(path)
    group_rows = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], np.int64)
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.shape[0] != int(group_rows.sum()):
        raise ValueError(f"{path}: {lengths.shape[0]} lengths for {int(group_rows.sum())} rows")
    if lengths.size and (lengths.min() < 0 or lengths.max() > np.iinfo(np.uint32).max):
        raise ValueError(f"{path}: row lengths out of range")
    dtype = np.uint16 if not lengths.size or lengths.max() <= np.iinfo(np.uint16).max else np.uint32
    return ShardIndex(lengths=lengths.astype(dtype), group_rows=group_rows,
                      group_spans=np.array(spans, np.int64).reshape(-1, 2), group_sha256=group_sha,
                      footer_span=footer, footer_sha256=footer_sha, file_bytes=size, file_sha256=whole.hexdigest())
