"""What the build reads, in one place: before any work, its inputs (files listed with their stamps, or a Ray
Dataset of documents) and the vocabulary's bytes when one is given, all failing cheaply, naming the fix, before the
output is touched (``read_inputs``); then the first stage, which cuts big compressed inputs into unit-sized pieces
and plans the units (``pieces.py``). The read pass (``pipeline/read.py``) is the one pass over their text."""
from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import Any

from pipeline.config import BuildConfig
from storage.fs import FileInfo, expand_inputs, read_bytes
from storage.redact import redact_url


@dataclasses.dataclass
class BuildInputs:
    """What the build reads, listed and checked before any work: input files or a Dataset, and the vocabulary."""

    files: list[FileInfo]
    """The input files, sorted by URL, with their sizes and version stamps; empty for a Dataset."""
    stamps: list[dict[str, Any]] | None
    """Each input's identity, what ``_work/config.json`` and the manifest keep: its redacted URL, size, etag, mtime
    (and a digest for an http(s) input without an ETag). None for a Dataset: its digest is known once the read pass
    has read it."""
    ignored: list[str]
    """Redacted URLs of the files of an input folder or glob that are not corpus files by their names (skipped)."""
    vocab_bytes: bytes | None
    """The bytes of the vocabulary (``--vocab``); None when none was given and the build trains one on the input."""
    documents: Any = None
    """The user's Ray Dataset of documents; None when the build reads files."""
    id_column: str = "id"
    """The Dataset's column of document ids (with ``documents`` only)."""

    @property
    def vocab_sha256(self) -> str | None:
        return hashlib.sha256(self.vocab_bytes).hexdigest() if self.vocab_bytes is not None else None


def read_vocab(cfg: BuildConfig) -> bytes | None:
    if not cfg.vocab:
        return None
    try:
        return read_bytes(cfg.vocab, cfg.endpoint_url)
    except FileNotFoundError as e:
        raise ValueError(f"--vocab {cfg.vocab} does not exist: pass a BERT vocab.txt, or omit --vocab to train"
                         " one on the input") from e


def read_inputs(cfg: BuildConfig, documents: Any = None, id_column: str = "id") -> BuildInputs:
    """The inputs and the vocabulary, checked: files listed (an input's identity is its redacted URL: what the
    manifest shows and reruns compare), or a Dataset's columns checked."""
    if (documents is None) == (not cfg.inputs):
        raise ValueError("no inputs: pass at least one --input" if documents is None else
                         "both inputs and a documents Dataset: give the build one of them")
    if documents is not None:
        if cfg.vocab is None:
            raise ValueError("a build of a documents Dataset needs a vocabulary: pass BuildConfig(vocab=...) (train"
                             " one with jobs/train_tokenizer.py)")
        check_columns(documents, id_column, cfg.read.text_field)
        return BuildInputs([], None, [], read_vocab(cfg), documents, id_column)
    kept = _LISTED.pop(_listing_key(cfg.inputs, cfg.endpoint_url), None)
    _LISTED.clear()
    if kept is not None and time.monotonic() - kept[0] <= KEEP_LISTING_S:
        files, ignored = kept[1], kept[2]
    else:
        files, ignored = list_inputs(cfg.inputs, cfg.endpoint_url)
    return BuildInputs(files, file_stamps(files), [redact_url(p) for p in ignored], read_vocab(cfg))


# The listing the preflight made, handed to the build that follows it in the same process (jobs/build_dataset.py:
# check_build, then build): the inputs are listed once per build. Taken once, and only while fresh (the job starts
# Ray and MLflow in between): a later build lists again.
_LISTED: dict[tuple, tuple[float, list[FileInfo], list[str]]] = {}
KEEP_LISTING_S = 300.0


def _listing_key(inputs, endpoint_url: str | None) -> tuple:
    return tuple(inputs), endpoint_url


def list_inputs(inputs, endpoint_url: str | None = None) -> tuple[list[FileInfo], list[str]]:
    """(the input files, the URLs of the files skipped as not corpus files): ``storage.fs.expand_inputs``."""
    ignored: list[str] = []
    files = expand_inputs(list(inputs), endpoint_url, skipped=ignored)
    return files, ignored


def keep_listing(inputs, endpoint_url: str | None, files: list[FileInfo], ignored: list[str]) -> None:
    """Keep a listing that passed the preflight for the next ``read_inputs`` of the same inputs in this process,
    which takes it instead of listing again (each LIST and HEAD once; an http(s) input without an ETag is
    downloaded whole to identify it, so it was downloaded twice more before its build read it)."""
    _LISTED.clear()  # one build's listing at a time
    _LISTED[_listing_key(inputs, endpoint_url)] = (time.monotonic(), files, ignored)


def file_stamps(files: list) -> list[dict[str, Any]]:
    """Each file's identity: its redacted URL, size, ETag and mtime (and its bytes' digest for an http(s) input
    without an ETag)."""
    return [{"path": redact_url(f.path), "size": f.size, "etag": f.etag, "mtime": f.mtime}
            | ({"digest": f.digest} if f.digest else {}) for f in files]


def check_columns(ds: Any, id_column: str, text_column: str) -> None:
    """The columns, when the Dataset knows them without running (a read or from_items; a map's output is only
    known by running it, and the read pass names a missing column then)."""
    schema = ds.schema(fetch_if_missing=False)
    if schema is None:
        return
    names = list(schema.names)
    for col, flag in ((id_column, "id_column"), (text_column, "read.text_field (--text-field)")):
        if col not in names:
            raise ValueError(f"the documents Dataset has no column {col!r} (columns: {names}): add it (for example"
                             f" with map_batches) or name the column with BuildConfig.{flag}")
