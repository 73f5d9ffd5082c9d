"""fsspec helpers for the data build: filesystems by URL, input expansion, early checks, atomic commits, JSON.

Every path is a URL (``s3://bucket/key``, ``gs://``, ``http(s)://``, or a local path). S3 credentials come from the
standard AWS environment/config (boto's chain); ``endpoint_url`` points at an S3-compatible store (MinIO, Ceph).

Atomic commit: readers treat a file as present only once it has its final name. Locally we write ``NAME.tmp-<uuid>``
and ``os.replace`` it (atomic on POSIX); on object stores a single PUT is atomic, so the final key is written in one
``pipe`` call and never appears half-written. This protects against killed processes (the resume contract), not
against power loss: we do not fsync (it cost ~10% of a small build here); a crashed machine's _work is rebuilt.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import posixpath
import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, TypeVar

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from storage.redact import check_endpoint_url, redact_text
from storage.retry import retrying, s3_options

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd"}
@dataclasses.dataclass(frozen=True)
class FileInfo:
    """One input file: its URL, the key that names it in document ids, size and a version stamp."""

    path: str
    """The file's URL (or local path), as the filesystem lists it."""
    key: str
    """Its path relative to the input it was found under, without a compression suffix, so that ``corpus.txt.gz``
    and ``corpus.txt`` give the same document ids; prefixed ``<input index>:`` where two inputs' names clash."""
    size: int
    """Size in bytes as stored (compressed, if it is)."""
    etag: str | None = None
    """The store's strong ETag, quotes stripped; None where there is none (a weak ``W/`` ETag promises no bytes)."""
    mtime: str | None = None
    """Last-modified time as the store reports it, as text (a datetime in ISO 8601); None where it gives none."""
    digest: str | None = None
    """``sha256:<hex>`` of the bytes of an http(s) input whose server sends no strong ETag: nothing else there
    changes with every edit. None for every other input."""


def protocol_of(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else "file"


def is_url(path: str) -> bool:
    """True for remote URLs (s3://, gs://, http(s)://, ...); False for local paths and file:// URLs."""
    return "://" in path and not path.startswith("file://")


def absolute(path: str) -> str:
    """A local path made absolute; URLs (file:// included) as they are. Jobs resolve what the user typed where it was
    typed: a Ray worker's working directory is not the job's (Ray Train runs each in its run's artifact folder)."""
    return path if "://" in path else os.path.abspath(path)


def storage_options(url: str, endpoint_url: str | None = None) -> dict[str, Any]:
    if protocol_of(url) in ("s3", "s3a"):
        return s3_options(check_endpoint_url(endpoint_url) if endpoint_url else None)
    return {}


def filesystem_for(url: str, endpoint_url: str | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path inside it) for a URL; ``endpoint_url`` applies to s3:// only."""
    try:
        return url_to_fs(url, **storage_options(url, endpoint_url))
    except ImportError as e:  # e.g. gs:// without gcsfs: say which URL needs which package
        raise ValueError(f"cannot open {url}: {e}") from e


def unstrip(fs: fsspec.AbstractFileSystem, path: str, like: str) -> str:
    """The URL of ``path`` on ``fs`` (fsspec strips the protocol)."""
    if isinstance(fs, LocalFileSystem) or "://" not in like:
        return path
    proto = protocol_of(like)
    return path if path.startswith(proto + "://") else f"{proto}://{path}"


def join(url: str, *parts: str) -> str:
    """``url/part/...`` for local paths and URLs alike."""
    return posixpath.join(url.rstrip("/"), *parts) if "://" in url else os.path.join(url, *parts)


def without_query(path: str) -> str:
    """An http(s) URL's path without its query (a presigned URL's signature): what names the file's type."""
    return path.split("?", 1)[0] if protocol_of(path) in ("http", "https") else path


def compression_of(path: str) -> str | None:
    path = without_query(path)
    for ext, name in COMPRESSIONS.items():
        if path.endswith(ext):
            return name
    return None


def strip_compression(path: str) -> str:
    for ext in COMPRESSIONS:
        if path.endswith(ext):
            return path[: -len(ext)]
    return path


def _describe(url: str) -> str:
    if protocol_of(url) in ("s3", "s3a", "gs", "gcs"):
        bucket = url.split("://", 1)[1].split("/", 1)[0]
        return f"{url} (bucket {bucket!r})"
    return url


def storage_error(url: str, e: BaseException, doing: str) -> ValueError:
    """A user-facing error that names the path/bucket and says how to fix the usual causes."""
    text = f"{type(e).__name__}: {e}"
    hint = ""
    low = text.lower()
    if "credential" in low or "accessdenied" in low or "access denied" in low or "forbidden" in low or \
            "invalidaccesskeyid" in low or "signaturedoesnotmatch" in low or isinstance(e, PermissionError):
        hint = (" Check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws) and the"
                " bucket policy.")
    elif "nosuchbucket" in low or "bucket" in low and "not exist" in low:
        hint = " The bucket does not exist: create it or fix the URL."
    elif "connect" in low or "endpoint" in low:
        hint = " Check --endpoint-url and that the server is reachable."
    # Redacted: storage clients quote the URL they were given (aiohttp with its signed query), and this message
    # is shown, logged and, from a Ray task, carried to the driver.
    return ValueError(redact_text(f"cannot {doing} {_describe(url)}: {text}.{hint}"))


def _stamp(info: dict) -> tuple[str | None, str | None]:
    etag = info.get("ETag") or info.get("etag") or info.get("md5Hash")
    mtime = (info.get("LastModified") or info.get("mtime") or info.get("updated") or info.get("last_modified")
             or info.get("Last-Modified"))
    if isinstance(etag, str):
        etag = None if etag.startswith("W/") else etag.strip('"')  # a weak ETag does not promise the same bytes
    if mtime is not None and not isinstance(mtime, str):
        mtime = mtime.isoformat() if hasattr(mtime, "isoformat") else str(mtime)
    return etag, mtime


METADATA_THREADS = 32  # metadata calls in flight at once: object stores answer each in ~10-100 ms


def map_threads(fn: Callable[[T], R], items: Iterable[T], threads: int = METADATA_THREADS) -> list[R]:
    """``[fn(x) for x in items]`` with up to ``threads`` calls in flight, in order; the first error is raised.

    For metadata round trips (listings, stats, trailers, markers): with thousands of S3 objects one call after
    another costs minutes of latency and no CPU. fsspec's async filesystems (s3fs, gcsfs) are safe to call from
    threads: each call runs on fsspec's own event loop.
    """
    items = list(items)
    if len(items) <= 1 or threads <= 1:
        return [fn(x) for x in items]
    with concurrent.futures.ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="metadata") as pool:
        return list(pool.map(fn, items))


# What a folder or a glob contributes: files whose name says they hold corpus text in a format the readers know
# (before any .gz/.bz2/.xz/.zst suffix), and files with no extension at all, the usual names of corpus dumps
# (WikiExtractor's ``AA/wiki_00``, Spark's ``part-00000``). Anything else found there (a README.md, a licence,
# an .xml dump, a .zip) is listed as skipped: ingesting it would put non-corpus text in the dataset. A file named
# directly, or by a glob that spells out its extension (``*.md``), is read whatever its name: the user chose it.
CORPUS_EXTENSIONS = (".txt", ".text", ".jsonl", ".json", ".ndjson", ".parquet", ".pq")
# ... and these names, as the first or last word of a file's name (README, LICENSE-MIT, vim-license.txt).
NOT_CORPUS_WORDS = ("readme", "license", "licence", "copying", "notice", "authors", "changelog")
_SHOWN = 5  # skipped names listed in the warning; the rest are counted


def is_corpus_file(path: str) -> bool:
    """Whether a file found in an input folder or glob is taken as corpus (see CORPUS_EXTENSIONS)."""
    stem, ext = posixpath.splitext(strip_compression(posixpath.basename(path.rstrip("/"))).lower())
    words = [w for w in re.split(r"[^a-z0-9]+", stem) if w]
    if words and (words[0] in NOT_CORPUS_WORDS or words[-1] in NOT_CORPUS_WORDS):
        return False
    return ext in CORPUS_EXTENSIONS or ext == ""


def _names_extension(pattern: str) -> bool:
    """True when a glob's last part spells out an extension (``*.md``): what it matches was asked for."""
    _, ext = posixpath.splitext(strip_compression(posixpath.basename(pattern)))
    return bool(ext) and not any(c in ext for c in "*?[")


def _list_url(url: str, endpoint_url: str | None) -> tuple[str, dict[str, dict], list[str]]:
    """(root the keys are relative to, {path: info}, skipped non-corpus paths) of the files one input URL names."""
    fs, path = filesystem_for(url, endpoint_url)
    # In an http(s) URL '?' starts the query (a presigned URL's signature), not a glob: fsspec cannot glob http.
    wildcards = "*[" if protocol_of(url) in ("http", "https") else "*?["
    try:
        if any(c in path for c in wildcards):
            infos = fs.glob(path, detail=True)  # one listing, not one stat per match
            root = path[: min(path.find(c) for c in wildcards if c in path)].rsplit("/", 1)[0]
            chosen = _names_extension(path)
        elif (info := fs.info(path)).get("type") == "directory":  # one round trip tells a file from a folder
            infos = fs.find(path, detail=True)
            root, chosen = path, False
        else:
            infos = {path: info}
            root, chosen = posixpath.dirname(path.rstrip("/")), True
    except FileNotFoundError as e:
        raise ValueError(f"input {_describe(url)} does not exist ({e}); fix --input") from e
    except Exception as e:  # botocore/aiohttp errors have no common base worth importing here
        raise storage_error(url, e, "list input") from e
    files = {p: info for p, info in infos.items() if info.get("type", "file") != "directory"}
    files = {p: info for p, info in files.items()
             if not any(part.startswith((".", "_")) for part in p[len(root):].split("/") if part)}
    skipped = [] if chosen else sorted(unstrip(fs, p, url) for p in files if not is_corpus_file(p))
    files = {p: info for p, info in files.items() if chosen or is_corpus_file(p)}
    if not files:
        found = f" (it holds only files that are not corpus files: {_listing(skipped)})" if skipped else ""
        raise ValueError(f"input {_describe(url)} matches no corpus files{found}; fix --input"
                         + (", or name a file directly to read it anyway" if skipped else ""))
    if skipped:
        log.warning("input %s: skipped %d file(s) that are not corpus files by their names: %s. A folder or glob"
                    " contributes %s files (optionally compressed) and files with no extension; name a file"
                    " directly to read it anyway", url, len(skipped), _listing(skipped), "/".join(CORPUS_EXTENSIONS))
    return root, files, skipped


def _listing(paths: list[str]) -> str:
    names = ", ".join(posixpath.basename(p) for p in paths[:_SHOWN])
    return names + (f" and {len(paths) - _SHOWN} more" if len(paths) > _SHOWN else "")


def expand_inputs(urls: list[str], endpoint_url: str | None = None,
                  skipped: list[str] | None = None) -> list[FileInfo]:
    """Files named by ``urls`` (files, directories walked recursively, globs), sorted, with size and version.

    Raises ValueError naming the URL when nothing is there or the store refuses us (missing bucket, credentials),
    so the build fails before any work is scheduled. Hidden files (``.``/``_`` prefixes) inside directories are
    skipped, as Spark and Ray do; so are files that are not corpus files by their names (``is_corpus_file``),
    with a warning, their URLs appended to ``skipped``. The URLs are listed in parallel (``map_threads``); globs
    take one listing.

    A file's key (what names it in document ids) is its path relative to the input, *without* a compression
    suffix, so that ``corpus.txt.gz`` and ``corpus.txt`` give the same document ids and the same dataset. Two
    files whose keys would clash (``a.txt`` beside ``a.txt.gz``) keep their full names.
    """
    if not urls:
        raise ValueError("no --input given: pass at least one file, directory or glob")
    listed = map_threads(lambda url: _list_url(url, endpoint_url), urls)
    entries: list[tuple[str, str, int, dict]] = []  # (URL, relative name, input index, info)
    seen: set[str] = set()
    for i, (url, (root, files, ignored)) in enumerate(zip(urls, listed, strict=False)):
        if skipped is not None:
            skipped.extend(p for p in ignored if p not in skipped)
        fs, _ = filesystem_for(url, endpoint_url)
        for p in sorted(files):
            full = unstrip(fs, p, url)
            if full in seen:
                continue
            seen.add(full)
            rel = p[len(root):].lstrip("/") if p.startswith(root) else posixpath.basename(p)
            entries.append((full, rel or posixpath.basename(p), i, files[p]))
    names: dict[str, set[str]] = {}  # key without compression suffix -> the relative names that give it
    for _, rel, _, _ in entries:
        names.setdefault(strip_compression(rel), set()).add(rel)
    found: list[FileInfo] = []
    keys: set[str] = set()
    for full, rel, i, info in entries:
        key = strip_compression(rel) if len(names[strip_compression(rel)]) == 1 else rel
        if key in keys:  # two inputs with the same relative name: keep ids distinct and stable
            key = f"{i}:{key}"
        keys.add(key)
        etag, mtime = _stamp(info)
        found.append(FileInfo(path=full, key=key, size=int(info.get("size") or 0), etag=etag, mtime=mtime))
    # An http(s) server without a strong ETag gives nothing that changes with every edit (Last-Modified has
    # 1-second steps and may be absent; the size stays for a same-size edit): the bytes identify the file then. It
    # costs one extra download of such an input per run; servers that send an ETag cost nothing.
    unidentified = [i for i, f in enumerate(found) if protocol_of(f.path) in ("http", "https") and not f.etag]
    digests = map_threads(lambda i: content_digest(found[i].path, endpoint_url), unidentified)
    for i, digest in zip(unidentified, digests, strict=False):
        found[i] = dataclasses.replace(found[i], digest=digest)
    return sorted(found, key=lambda f: f.path)


DIGEST_CHUNK = 1 << 20


def content_digest(url: str, endpoint_url: str | None = None) -> str:
    """``sha256:<hex>`` of the bytes at ``url`` (streamed, not held in memory)."""
    fs, path = filesystem_for(url, endpoint_url)
    h = hashlib.sha256()
    try:
        with fs.open(path, "rb", block_size=DIGEST_CHUNK) as f:
            while chunk := f.read(DIGEST_CHUNK):
                h.update(chunk)
    except Exception as e:  # noqa: BLE001 - name the input and the fix, whatever the transport raised
        raise storage_error(url, e, "read input") from e
    return "sha256:" + h.hexdigest()


def check_writable(url: str, endpoint_url: str | None = None) -> None:
    """Fail early (naming the bucket/path) when the output cannot be written: missing bucket, credentials."""
    fs, path = filesystem_for(url, endpoint_url)
    probe = join(path, f"_write_probe-{uuid.uuid4().hex}")
    try:
        if isinstance(fs, LocalFileSystem):
            fs.makedirs(path, exist_ok=True)
        fs.pipe_file(probe, b"")
        fs.rm_file(probe)
    except Exception as e:
        raise storage_error(url, e, "write output to") from e


def _fresh(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Forget what this process cached of ``path``'s folder: s3fs answers ``info``/``exists`` (and sizes a
    ``cat_file``) from its listing cache, so a file another process (a Ray worker) wrote after this one listed the
    folder would read as missing."""
    fs.invalidate_cache(posixpath.dirname(path.rstrip("/")))


def exists(url: str, endpoint_url: str | None = None) -> bool:
    fs, path = filesystem_for(url, endpoint_url)
    _fresh(fs, path)
    return fs.exists(path)


def read_bytes(url: str, endpoint_url: str | None = None) -> bytes:
    """The bytes at ``url``, read again after a transient fault (bounded: ``storage.untrusted.read_bounded``)."""
    fs, path = filesystem_for(url, endpoint_url)
    _fresh(fs, path)
    return retrying(lambda: fs.cat_file(path), f"read {url}")


def write_bytes_atomic(url: str, data: bytes, endpoint_url: str | None = None) -> None:
    """Commit ``data`` under ``url`` so that readers see all of it or nothing."""
    fs, path = filesystem_for(url, endpoint_url)
    if isinstance(fs, LocalFileSystem):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    else:  # one PUT: atomic on S3/GCS; the same bytes again after a transient fault
        retrying(lambda: fs.pipe_file(path, data), f"write {url}")


def read_json(url: str, endpoint_url: str | None = None) -> Any:
    return json.loads(read_bytes(url, endpoint_url))


def write_json_atomic(url: str, obj: Any, endpoint_url: str | None = None) -> None:
    write_bytes_atomic(url, json.dumps(obj, indent=1, sort_keys=True).encode(), endpoint_url)


def remove_tree(url: str, endpoint_url: str | None = None) -> None:
    fs, path = filesystem_for(url, endpoint_url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def list_names(url: str, endpoint_url: str | None = None) -> list[str]:
    """Base names under a folder URL (empty when it does not exist)."""
    fs, path = filesystem_for(url, endpoint_url)
    fs.invalidate_cache()  # s3fs caches listings; markers written by workers must be seen
    try:
        return sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False))
    except FileNotFoundError:
        return []


TEMP_MARK = ".tmp-"  # NAME.tmp-<32 hex>: an open_atomic write not yet committed (or a killed writer's leftover)


def _temp_name(path: str) -> str:
    return f"{path}{TEMP_MARK}{uuid.uuid4().hex}"


@contextlib.contextmanager
def open_atomic(url: str, endpoint_url: str | None = None, fence: Any = None) -> Iterator[IO[bytes]]:
    """A binary file that appears under ``url`` only if the block exits cleanly (never half-written).

    Local: a temp name beside it, then ``os.replace``. Object stores without ``fence``: the object is created when
    the upload completes (one PUT, or CompleteMultipartUpload), and an exception discards the upload instead.

    ``fence`` (storage/fence.py): the writer's lease is proved fresh (``fence.check(fresh=True)``, one GET) after
    the bytes are written and right before the final name becomes visible, and nothing lands when it cannot be:
    a writer that stalled while another job took the output over never commits (LeaseLost). Locally that is just
    before the rename; on an object store the bytes go to a temporary key first, then the proof, then one
    server-side copy to the final key (the short step that makes it visible: no upload happens after the proof),
    then the temporary key is deleted.
    """
    fs, path = filesystem_for(url, endpoint_url)
    if isinstance(fs, LocalFileSystem):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = _temp_name(path)
        try:
            with open(tmp, "wb") as f:
                yield f
            if fence is not None:
                fence.check(fresh=True)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return
    target = _temp_name(path) if fence is not None else path
    f = fs.open(target, "wb")
    try:
        yield f
    except BaseException:
        discard = getattr(f, "discard", None)
        if discard is not None:
            discard()
        raise
    f.close()
    if fence is None:
        return
    try:
        fence.check(fresh=True)
        retrying(lambda: fs.copy(target, path), f"commit {url}")
    finally:
        with contextlib.suppress(Exception):  # a leftover is removed by remove_stale_temps at the build's end
            fs.rm_file(target)


_TEMP = re.compile(re.escape(TEMP_MARK) + r"[0-9a-f]{32}$")


def remove_stale_temps(url: str, endpoint_url: str | None = None) -> None:
    """Delete ``*.tmp-<uuid>`` leftovers of a killed writer under a folder (local, or on an object store): call it
    only when no writer of that folder is running."""
    fs, path = filesystem_for(url, endpoint_url)
    if isinstance(fs, LocalFileSystem):
        if os.path.isdir(path):
            for name in os.listdir(path):
                if TEMP_MARK in name:
                    os.remove(os.path.join(path, name))
        return
    fs.invalidate_cache(path)
    try:
        names = fs.ls(path, detail=False)
    except FileNotFoundError:
        return
    for name in names:
        if _TEMP.search(name.rstrip("/")):
            fs.rm_file(name)


def upload_tree(local: str | os.PathLike, url: str, endpoint_url: str | None = None, last: str = "config.json") -> None:
    """Copy a local directory's files under ``url``, ``last`` written last: a reader that finds it (a model's
    config.json) finds everything beside it."""
    from pathlib import Path

    fs, root = filesystem_for(url, endpoint_url)
    local = Path(local)
    files = sorted((p for p in local.rglob("*") if p.is_file()), key=lambda p: p.name == last)
    for p in files:
        fs.put_file(str(p), join(root, p.relative_to(local).as_posix()))
