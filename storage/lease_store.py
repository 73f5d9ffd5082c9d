"""Where a lease record lives, and the one operation a fence needs from it: a conditional write (compare-and-swap
on the record's version), with the store's own clock for ages.

- S3 (and stores that implement conditional writes: AWS since 2024-11, MinIO, moto): one object. Create is a
  PutObject with ``If-None-Match: *``; a replace is a PutObject with ``If-Match: <etag read>``. A read is a HEAD
  (etag, ``LastModified`` and the answer's ``Date``: the store's clock, both to the second) and a GET of exactly
  that version (``If-Match``). ``check_conditional_writes`` probes once per bucket that the store refuses what it
  should; a store that ignores the headers would let two writers in, so it is refused with one line.
- Local disk (and shared file systems that honour ``O_EXCL``/``link``, NFSv3+): a folder of numbered records,
  ``g0000000001.json``, ``g0000000002.json``, ... Version ``n`` is replaced by creating ``n+1`` with ``link()``, which
  fails when it exists, so of two writers that read ``n`` exactly one writes ``n+1``. The newest is the record; the
  two before it are kept and older ones removed. A writer that read a version since removed could re-create its
  number: it sees a newer one after its write, or one that does not name its write as the one it replaced, and
  takes its write back (``_LocalStore.replace``). The clock is the file system's: a probe file's modification time.

Nothing here interprets the record beyond ``write_id`` and ``prev`` (which write a version is, which it replaced):
storage/lease.py says what a record holds.
"""
from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import fsspec.asyn

from storage import fs as storage_fs
from storage.retry import retrying

log = logging.getLogger(__name__)

MAX_RECORD_BYTES = 64 << 10  # a lease record is ~1 KB; anything bigger was not written by us
KEEP_LOCAL_VERSIONS = 3
_LOCAL_NAME = re.compile(r"^g(\d{10})\.json$")


@dataclass(frozen=True)
class Version:
    """One version of a record, with its age by the store's clock (never this host's)."""

    tag: str
    """What a conditional write names as the version it replaces: the S3 etag, or the local generation number."""
    modified: float
    """When the version was written, by the store's clock, in seconds since the epoch."""
    now: float
    """The store's clock when the version was read, in seconds since the epoch."""
    granularity: float = 0.0
    """How coarse ``modified`` and ``now`` are, in seconds: 1.0 on S3 (its dates are to the second), 0.0 for local
    file modification times."""

    @property
    def age_at_least(self) -> float:
        return self.now - self.modified - self.granularity

    @property
    def age_at_most(self) -> float:
        return self.now - self.modified + self.granularity


class StoreRefused(ValueError):
    """The store does not honour conditional writes (a user-facing error naming the endpoint)."""


def _parse(data: bytes, where: str) -> dict[str, Any]:
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"lease {where} is over {MAX_RECORD_BYTES} bytes, not a lease record: delete it")
    try:
        record = json.loads(data)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        # Foreign bytes, or a record of an older version of this tool: no holder we can prove alive.
        return {"token": None, "what": "unknown writer", "foreign": True}
    return record


def _encode(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True).encode()


class _S3Store:
    def __init__(self, url: str, fs, path: str) -> None:
        self.url, self.fs = url, fs
        self.bucket, _, self.key = path.partition("/")

    def _call(self, method: str, doing: str, done=None, **kwargs):
        return retrying(lambda: self.fs.call_s3(method, Bucket=self.bucket, Key=self.key, **kwargs),
                        f"{doing} {self.url}", done=done)

    def read(self) -> tuple[dict[str, Any], Version] | None:
        """One GET: the body, its etag and LastModified, and the answer's Date (the store's clock)."""
        try:
            data, head = retrying(lambda: fsspec.asyn.sync(self.fs.loop, _get_object, self.fs, self.bucket,
                                                           self.key), f"read {self.url}")
        except FileNotFoundError:
            return None
        now = email.utils.parsedate_to_datetime(head["ResponseMetadata"]["HTTPHeaders"]["date"]).timestamp()
        version = Version(str(head["ETag"]).strip('"'), head["LastModified"].timestamp(), now, granularity=1.0)
        return _parse(data, self.url), version

    def create(self, record: dict[str, Any]) -> bool:
        try:
            self._call("put_object", "create", done=lambda: self._landed(record), Body=_encode(record),
                       IfNoneMatch="*")
        except OSError as e:
            if isinstance(e, FileExistsError) or _precondition(e):
                return self._landed(record)  # botocore retried our own PUT whose answer was lost
            raise
        return True

    def replace(self, record: dict[str, Any], expected: Version) -> bool:
        try:
            self._call("put_object", "write", done=lambda: self._landed(record), Body=_encode(record),
                       IfMatch=f'"{expected.tag}"')
        except FileNotFoundError:
            return False
        except OSError as e:
            if _precondition(e):
                return self._landed(record)
            raise
        return True

    def _landed(self, record: dict[str, Any]) -> bool:
        got = self.read()
        return got is not None and got[0].get("write_id") == record["write_id"]

    def delete(self, expected: Version) -> bool:
        try:
            self._call("delete_object", "delete", IfMatch=f'"{expected.tag}"')
        except FileNotFoundError:
            return True
        except OSError as e:
            if _precondition(e):
                return False
            raise
        return True

    def check_conditional_writes(self, endpoint_url: str | None) -> None:
        _probe_s3(self.fs, self.bucket, self.url, endpoint_url)


async def _get_object(fs, bucket: str, key: str) -> tuple[bytes, dict[str, Any]]:
    """A GET through s3fs's client, answer headers kept (s3fs's ``cat_file`` drops them), the body bounded."""
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key)
    body = response.pop("Body")
    try:
        if int(response.get("ContentLength") or 0) > MAX_RECORD_BYTES:
            raise ValueError(f"lease s3://{bucket}/{key} is {response.get('ContentLength')} bytes, not a lease "
                             "record: delete it")
        return await body.read(), response
    finally:
        body.close()


def _precondition(e: BaseException) -> bool:
    """s3fs turns S3's 412 PreconditionFailed into OSError(EINVAL, "...pre-conditions ... did not hold")."""
    text = str(e).lower()
    return "precondition" in text or "pre-condition" in text or "412" in text


_probed: set[tuple[str | None, str]] = set()
_probe_lock = threading.Lock()


def _probe_s3(fs, bucket: str, url: str, endpoint_url: str | None) -> None:
    """Once per (endpoint, bucket) and process: a second create with If-None-Match and a write with a wrong If-Match
    must both be refused; a store that lets either through cannot keep one writer per output."""
    with _probe_lock:
        if (endpoint_url, bucket) in _probed:
            return
        key = f"_lease_probe-{uuid.uuid4().hex}"
        where = f"--endpoint-url {endpoint_url}" if endpoint_url else "the S3 endpoint"

        def put(**conditions) -> bool:
            try:
                retrying(lambda: fs.call_s3("put_object", Bucket=bucket, Key=key, Body=b"probe", **conditions),
                         f"probe conditional writes at {url}")
            except OSError as e:
                if isinstance(e, FileExistsError) or _precondition(e):
                    return False
                raise
            return True

        try:
            put(IfNoneMatch="*")
            ignored = [h for h, c in (("If-None-Match", {"IfNoneMatch": "*"}),
                                      ("If-Match", {"IfMatch": '"0123456789abcdef0123456789abcdef"'})) if put(**c)]
        finally:
            with contextlib.suppress(Exception):
                fs.call_s3("delete_object", Bucket=bucket, Key=key)
        if ignored:
            raise StoreRefused(
                f"{where} (bucket {bucket!r}) ignores conditional writes ({' and '.join(ignored)} let a second writer"
                " through), so it cannot keep two jobs from writing one output: use a store that honours them (AWS"
                " S3, MinIO, Ceph RGW 18+) or a local --storage/--output")
        _probed.add((endpoint_url, bucket))


# A local record's scratch files (the clock probe, a version before its link) exist only inside one call; a process
# that ends itself on a lost lease (os._exit: no finally runs) takes this first, so none is left in the folder.
SCRATCH = threading.RLock()


class _LocalStore:
    def __init__(self, url: str, path: str) -> None:
        self.url, self.dir = url, path

    def _versions(self) -> list[int]:
        try:
            names = os.listdir(self.dir)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(int(m.group(1)) for n in names if (m := _LOCAL_NAME.match(n)))

    def _file(self, n: int) -> str:
        return os.path.join(self.dir, f"g{n:010d}.json")

    def now(self) -> float:
        """The file system's clock (an NFS server's, not this host's): a probe file's modification time."""
        os.makedirs(self.dir, exist_ok=True)
        with SCRATCH:
            fd, probe = tempfile.mkstemp(prefix=".clock-", dir=self.dir)
            try:
                return os.fstat(fd).st_mtime
            finally:
                os.close(fd)
                os.remove(probe)

    def read(self) -> tuple[dict[str, Any], Version] | None:
        if os.path.isfile(self.dir):  # a record of an older version of this tool: one file, not a folder
            with open(self.dir, "rb") as f:
                data = f.read(MAX_RECORD_BYTES + 1)
            return _parse(data, self.url), Version("legacy", os.path.getmtime(self.dir), self.now())
        for _ in range(5):
            versions = self._versions()
            if not versions:
                return None
            n = versions[-1]
            try:
                with open(self._file(n), "rb") as f:
                    data = f.read(MAX_RECORD_BYTES + 1)
                    modified = os.fstat(f.fileno()).st_mtime
            except FileNotFoundError:  # removed as old between the listing and the open: list again
                continue
            return _parse(data, self.url), Version(str(n), modified, self.now())
        raise OSError(f"lease {self.url} changes faster than it can be read")

    def _link(self, n: int, record: dict[str, Any]) -> bool:
        """Create version n holding ``record``; False when it exists, or when the folder does not (a record forgotten
        since it was read: only ``create`` makes the folder)."""
        with SCRATCH:
            try:
                fd, tmp = tempfile.mkstemp(prefix=".write-", dir=self.dir)
            except FileNotFoundError:
                return False
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_encode(record))
                os.link(tmp, self._file(n))  # fails when n exists: the compare-and-swap
                return True
            except FileExistsError:
                return False
            finally:
                os.remove(tmp)

    def create(self, record: dict[str, Any]) -> bool:
        if os.path.isfile(self.dir) or self._versions():
            return False
        os.makedirs(self.dir, exist_ok=True)
        return self._link(1, record) and self._current(1, record)

    def replace(self, record: dict[str, Any], expected: Version) -> bool:
        if expected.tag == "legacy":  # an older tool's single-file record: move it aside, then start the folder
            aside = f"{self.dir}.old-{uuid.uuid4().hex}"
            try:
                os.rename(self.dir, aside)
            except FileNotFoundError:
                return False
            os.remove(aside)
            return self.create(record)
        n = int(expected.tag) + 1
        if not self._link(n, record):
            return False
        if not self._current(n, record):
            return False
        for old in self._versions():
            if old <= n - KEEP_LOCAL_VERSIONS:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self._file(old))
        return True

    def _current(self, n: int, record: dict[str, Any]) -> bool:
        """After writing version n: is it really the successor of what we read? The version before it must be the
        one we read (``prev``), and a version newer than n must have replaced exactly our write; otherwise we read a
        version long gone (removed as old, or the whole record forgotten and made again since) and re-created its
        successor's number: our write is taken back."""
        if n > 1 and self._write_id(n - 1) != record.get("prev"):
            ours = False
        elif any(v > n for v in self._versions()):
            ours = self._prev(n + 1) == record["write_id"]
        else:
            return True
        if not ours:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._file(n))
        return ours

    def _read_field(self, n: int, field: str) -> Any:
        try:
            with open(self._file(n), "rb") as f:
                return json.loads(f.read(MAX_RECORD_BYTES)).get(field)
        except (FileNotFoundError, ValueError, AttributeError):
            return None

    def _write_id(self, n: int) -> Any:
        return self._read_field(n, "write_id")

    def _prev(self, n: int) -> Any:
        return self._read_field(n, "prev")

    def delete(self, expected: Version) -> bool:
        """Forget the record (only ever a released one): renamed aside in one step, then removed, so that a writer
        that read it before cannot add a version to it (``_link`` never makes the folder again)."""
        aside = f"{self.dir}.forgotten-{uuid.uuid4().hex}"
        try:
            os.rename(self.dir, aside)
        except FileNotFoundError:
            return True
        shutil.rmtree(aside, ignore_errors=True)
        return True

    def check_conditional_writes(self, endpoint_url: str | None) -> None:
        pass  # link() and O_EXCL are POSIX; a file system without them fails the write itself


def store_for(url: str, endpoint_url: str | None = None):
    """The record store of a lease URL: S3 (conditional PUTs) or local disk (numbered records)."""
    fs, path = storage_fs.filesystem_for(url, endpoint_url)
    if storage_fs.protocol_of(url) in ("s3", "s3a"):
        return _S3Store(url, fs, path)
    if storage_fs.is_url(url):
        raise ValueError(f"{url}: a writer lease needs conditional writes, which only S3-compatible stores and local"
                         " (or NFS) paths give here; write to s3:// or a local path")
    return _LocalStore(url, path)
