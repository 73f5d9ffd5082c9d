"""One writer per output: a lease (an owner record with a heartbeat) that a build's output folder, a training run
(`--storage` + `--run-name`) and an export destination are held under while a job writes them.

The record is a small JSON file: who holds it (host, pid, start time, what it is doing), a random token, and the
time of its last heartbeat. It is *created* exclusively, so of two writers started together exactly one gets it:

- on local disk (and shared file systems that honour it, NFSv3+), ``open(O_CREAT | O_EXCL)``;
- on S3 (and stores that implement it: AWS since 2024-11, MinIO, moto), a PutObject with ``If-None-Match: *``.
  A store that ignores the header would let both PUTs through, so the creator reads the record back after a
  short wait and refuses when the token there is not its own (the last writer wins on such stores: the loser
  sees it).

A thread rewrites the heartbeat every ``stale/4`` seconds. A second writer that finds the record refuses in one
line naming the holder and what to do. A record whose heartbeat is older than ``stale_seconds()`` (60 s, or
``BERT_LEASE_STALE_SECONDS``; the holder's own setting, kept in its record, when that is longer) belongs to a
writer that died (SIGKILL, a lost node): the next writer takes it over with a WARNING. A takeover is itself
exclusive: on S3 a PutObject with ``If-Match: <etag of the stale record>``; locally a short-lived ``.takeover``
file created with O_EXCL around re-reading and replacing the record. The lease is released (its record deleted)
when the block exits, on error too. A holder whose heartbeat finds the record no longer its own (it stalled past
the stale time and was taken over) logs an ERROR and interrupts its main thread, so it stops writing.
"""
from __future__ import annotations

import _thread
import contextlib
import datetime as dt
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from pipeline import storage
from pipeline.safe_io.retry import retrying

log = logging.getLogger(__name__)

# A holder whose heartbeat is older than this is taken to be dead. It must be well above the heartbeat period
# (stale/4) plus the slowest round trip to the store, so that a live writer on a loaded machine is never taken
# over; 60 s leaves 45 s of slack. Tests shorten it through the environment variable.
STALE_SECONDS = 60.0
STALE_ENV = "BERT_LEASE_STALE_SECONDS"
READ_BACK_SECONDS = 0.5  # how long a creator waits before reading its record back (stores without conditional PUT)
MAX_RECORD_BYTES = 64 << 10  # a lease record is ~300 bytes; anything bigger was not written by us


def stale_seconds() -> float:
    """The stale time in force: ``BERT_LEASE_STALE_SECONDS`` when set (tests, operators), else STALE_SECONDS."""
    raw = os.environ.get(STALE_ENV)
    if not raw:
        return STALE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{STALE_ENV}={raw!r}: give a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{STALE_ENV}={raw!r}: give a positive number of seconds")
    return value


class LeaseHeld(ValueError):
    """Another live writer holds the lease (a user-facing error: its message says who and what to do)."""


class LeaseLost(RuntimeError):
    """The record is no longer ours: we stalled past the stale time and another writer took over."""


def _now() -> float:
    return time.time()


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")


def lease_url_beside(target: str) -> str:
    """The lease of a folder that is replaced as a whole (an export, a training run's folder): a sibling file
    ``<target>.lease.json``, which the folder's replacement or removal does not touch."""
    trimmed = target.rstrip("/")
    if not trimmed or (storage.is_url(trimmed) and "/" not in trimmed.split("://", 1)[1]):
        raise ValueError(f"{target}: name a folder inside the bucket or disk, not its root")
    return trimmed + ".lease.json"


class Lease:
    """The lease at ``url`` for the writer of ``target`` (``what`` says who we are in messages). Use as a context
    manager, or ``acquire()``/``release()``."""

    def __init__(self, url: str, target: str, what: str, endpoint_url: str | None = None,
                 hint: str = "or write somewhere else") -> None:
        self.url, self.target, self.what, self.hint = url, target, what, hint
        self.endpoint_url = endpoint_url
        self.token = uuid.uuid4().hex
        self.stale = stale_seconds()
        self.started = _now()
        self._fs, self._path = storage.filesystem_for(url, endpoint_url)
        self._local = isinstance(self._fs, LocalFileSystem)
        self._etag: str | None = None  # of our record on S3: heartbeats replace exactly it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False

    # ---- the record ----------------------------------------------------------------------------------------------

    def _record(self) -> bytes:
        return json.dumps({
            "token": self.token, "host": socket.gethostname(), "pid": os.getpid(),
            # The program only: its arguments may hold URLs with credentials, and this record is readable by all.
            "process": os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python",
            "what": self.what, "target": self.target,
            "started": _iso(self.started), "started_unix": self.started, "heartbeat_unix": _now(),
            "stale_seconds": self.stale,
        }, sort_keys=True).encode()

    def _read(self) -> tuple[dict[str, Any], str | None] | None:
        """(record, etag) now at the URL; None when there is none."""
        try:
            if self._local:
                with open(self._path, "rb") as f:
                    data = f.read(MAX_RECORD_BYTES + 1)
                etag = None
            else:
                self._fs.invalidate_cache(self._path)  # s3fs may answer from a cached listing: ask the store
                info = retrying(lambda: self._fs.info(self._path), f"stat {self.url}")
                if int(info.get("size") or 0) > MAX_RECORD_BYTES:
                    raise ValueError(f"lease {self.url} is {info.get('size')} bytes, not a lease record: delete it")
                data = retrying(lambda: self._fs.cat_file(self._path), f"read {self.url}")
                etag = str(info.get("ETag") or info.get("etag") or "").strip('"') or None
        except FileNotFoundError:
            return None
        if len(data) > MAX_RECORD_BYTES:
            raise ValueError(f"lease {self.url} is over {MAX_RECORD_BYTES} bytes, not a lease record: delete it")
        try:
            record = json.loads(data)
            float(record["heartbeat_unix"])
        except (ValueError, KeyError, TypeError):
            # A half-written local record (a writer killed between create and write) or foreign bytes: treat it as
            # a record with no heartbeat, i.e. stale. Its file time stands in for the heartbeat.
            record = {"token": None, "host": "?", "pid": "?", "started": "?", "what": "unknown writer",
                      "heartbeat_unix": self._mtime()}
        return record, etag

    def _mtime(self) -> float:
        try:
            return os.path.getmtime(self._path) if self._local else 0.0
        except OSError:
            return 0.0

    def _create(self) -> bool:
        """Create the record if there is none; False when one exists."""
        data = self._record()
        if self._local:
            os.makedirs(os.path.dirname(self._path) or ".", exist_ok=True)
            try:
                fd = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return True
        try:
            out = retrying(lambda: self._fs.pipe_file(self._path, data, mode="create"), f"create {self.url}",
                           done=lambda: self._is_ours())
        except FileExistsError:
            # botocore retries a PUT whose answer was dropped by itself: the retry then fails against the record
            # the first attempt wrote. The token says whether that record is ours.
            return self._is_ours()
        self._etag = _etag_of(out) or self._etag
        return True

    def _is_ours(self) -> bool:
        """After a PUT whose answer was lost (a dropped connection): did it land?"""
        got = self._read()
        if got is not None and got[0].get("token") == self.token:
            self._etag = got[1]
            return True
        return False

    def _replace(self, expected_etag: str | None) -> bool:
        """Overwrite the record (S3: only if it still has ``expected_etag``); False when someone else changed it."""
        data = self._record()
        if self._local:
            tmp = f"{self._path}.tmp-{uuid.uuid4().hex}"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self._path)
            return True
        condition = {"IfMatch": f'"{expected_etag}"'} if expected_etag else {}
        try:
            out = retrying(lambda: self._fs.pipe_file(self._path, data, **condition), f"renew {self.url}",
                           done=lambda: self._is_ours())
        except OSError as e:  # s3fs: a failed If-Match is OSError(EINVAL, "...pre-conditions ... did not hold")
            if isinstance(e, (FileExistsError, FileNotFoundError)) or "condition" in str(e).lower():
                # Someone else's record, or our own: botocore retried a PUT whose answer was dropped, and the retry
                # failed against the record its first attempt wrote. The token tells the two apart.
                return self._is_ours()
            raise
        self._etag = _etag_of(out) or self._etag
        return True

    # ---- acquire, heartbeat, release -----------------------------------------------------------------------------

    def acquire(self) -> Lease:
        """Take the lease, or raise LeaseHeld (one line: who holds it, what to do); a store that refuses us (a
        missing bucket, credentials) is a ValueError naming the URL and the usual fix."""
        try:
            return self._acquire()
        except (ValueError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - botocore/aiohttp/OS errors: name the URL and the fix
            raise storage.storage_error(self.target, e, "write to") from e

    def _acquire(self) -> Lease:
        for _ in range(3):  # a holder may release between our create and our read: look again
            if self._create():
                if not self._local:
                    time.sleep(READ_BACK_SECONDS)
                    if not self._is_ours():
                        raise LeaseHeld(self._refusal(self._read()))
                break
            got = self._read()
            if got is None:
                continue
            record, etag = got
            age = _now() - float(record["heartbeat_unix"])
            stale = self._stale_for(record)
            if age <= stale:
                raise LeaseHeld(self._refusal(got))
            if self._take_over(record, etag):
                log.warning("%s: took over from %s, whose heartbeat stopped %.0f s ago (more than %.0f s: it died or"
                            " was killed); its unfinished output is resumed or replaced as the job's rules say",
                            self.target, _holder(record), age, stale)
                break
        else:
            raise LeaseHeld(self._refusal(self._read()))
        self._thread = threading.Thread(target=self._beat, name=f"lease-{os.path.basename(self._path)}", daemon=True)
        self._thread.start()
        log.info("holding the writer lease %s", self.url)
        return self

    def _stale_for(self, record: dict[str, Any]) -> float:
        """The holder heartbeats every stale/4 of *its* stale time: a taker configured shorter must not take over a
        live holder configured longer, so the longer of the two counts."""
        try:
            theirs = float(record.get("stale_seconds") or 0)
        except (TypeError, ValueError):
            theirs = 0.0
        return max(self.stale, min(theirs, 24 * 3600.0))

    def _take_over(self, stale: dict[str, Any], etag: str | None) -> bool:
        if not self._local:
            return etag is not None and self._replace(etag) and self._is_ours()
        guard = self._path + ".takeover"
        with contextlib.suppress(OSError):  # a taker killed inside its few milliseconds left it: stale as well
            if _now() - os.path.getmtime(guard) > self.stale:
                os.remove(guard)
        try:
            fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        os.close(fd)
        try:
            now = self._read()
            if now is None or now[0].get("token") != stale.get("token") or \
                    now[0].get("heartbeat_unix") != stale.get("heartbeat_unix"):
                return False  # it came back to life, or another taker was quicker
            return self._replace(None)
        finally:
            with contextlib.suppress(OSError):
                os.remove(guard)

    def _beat(self) -> None:
        period = self.stale / 4
        while not self._stop.wait(period):
            try:
                got = self._read()
                if got is None or got[0].get("token") != self.token or not self._replace(self._etag):
                    self._lose(got)
                    return
            except Exception as e:  # noqa: BLE001 - a failed beat is retried next period; stale time has slack
                log.warning("lease %s: heartbeat failed (%s: %s); retrying in %.0f s", self.url, type(e).__name__,
                            e, period)

    def _lose(self, got) -> None:
        self.lost = True
        holder = _holder(got[0]) if got else "nobody (the record was deleted)"
        log.error("lease %s is no longer ours: %s holds it now (this process stalled for more than %.0f s and was"
                  " taken over). Stopping this job so that it does not write over the new writer", self.url, holder,
                  self.stale)
        _thread.interrupt_main()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.lost:
            return
        try:
            got = self._read()
            if got is not None and got[0].get("token") == self.token:
                if self._local:
                    os.remove(self._path)
                else:
                    retrying(lambda: self._fs.rm_file(self._path), f"delete {self.url}")
        except Exception as e:  # noqa: BLE001 - an unreleased lease goes stale and is taken over: say so, go on
            log.warning("could not release the lease %s (%s); the next writer takes it over after %.0f s", self.url,
                        e, self.stale)

    def _refusal(self, got) -> str:
        if got is None:
            return f"{self.target}: could not take the writer lease {self.url}; try again"
        record = got[0]
        age = _now() - float(record["heartbeat_unix"])
        return (f"{self.target} is being written by another {record.get('what', 'writer')} ({_holder(record)},"
                f" heartbeat {age:.0f} s ago): wait for it to finish (a holder that died is taken over"
                f" {self._stale_for(record):.0f} s after its last heartbeat), {self.hint}")

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(record: dict[str, Any]) -> str:
    return (f"host {record.get('host')}, pid {record.get('pid')} ({record.get('process') or 'unknown process'}),"
            f" started {record.get('started')}")


def _etag_of(response: Any) -> str | None:
    if isinstance(response, dict):
        etag = response.get("ETag")
        return str(etag).strip('"') if etag else None
    return None


WAIT_POLL_SECONDS = 2.0


@contextlib.contextmanager
def holding(url: str, target: str, what: str, endpoint_url: str | None = None,
            hint: str = "or write somewhere else", wait: float = 0.0) -> Iterator[Lease]:
    """``with holding(...)``: the lease for the block, released on exit and on error. ``wait``: seconds to wait
    for a live holder to finish before refusing (an export after hours of training waits for another export's
    few seconds rather than failing)."""
    deadline, told = _now() + wait, False
    while True:
        try:
            lease = Lease(url, target, what, endpoint_url, hint).acquire()
            break
        except LeaseHeld as e:
            if _now() + WAIT_POLL_SECONDS > deadline:
                raise
            if not told:
                log.info("waiting up to %.0f s for the other writer: %s", deadline - _now(), e)
                told = True
            time.sleep(WAIT_POLL_SECONDS)
    try:
        yield lease
    finally:
        lease.release()


OUTPUT_LEASE = "_writer.lease.json"


def output_lease(output: str, what: str = "dataset build", ep: str | None = None,
                 hint: str = "or use another --output") -> contextlib.AbstractContextManager[Lease]:
    """The lease of a folder a job fills in place (a dataset build's --output): a file inside it."""
    return holding(storage.join(output, OUTPUT_LEASE), output, what, ep, hint)
