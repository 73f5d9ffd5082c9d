"""One writer per output: a lease that a build's output folder, a training run (`--storage` + `--run-name`) and an
export destination are held under while a job writes them, and the fence every process that writes for the job
checks it with (storage/fence.py).

The record (storage/lease_record.py) is changed only by conditional writes (storage/lease_store.py:
S3 ``If-None-Match``/``If-Match``, probed once per bucket; on local disk numbered records created with ``link()``),
so of two writers that read one version exactly one replaces it:

- **acquire**: create the record; or take it over when its holder is gone: at once when the record names a process
  on this host (same boot, same pid namespace) that has exited, else when the holder's last beat is older than the
  stale time S by the store's clock; or re-take a released record. A live holder is a ``LeaseHeld`` refusal naming it.
- **beat**: every S/4 the holder rewrites its record (if it is still its own). A separate watchdog thread steps the
  holder down when no beat has succeeded for 3/4 S (the store unreachable, a partition, the beat stuck in retries) or
  the record names someone else: one ERROR line naming who holds it now, then the process exits at once
  (``os._exit``, exit status 2: nothing more it would write, no SIGINT that a job started in the background ignores).
- **release**: the record is kept, marked released (token None), with what writers committed under it (a run's
  checkpoints): the next holder reads them to know what it may resume from.

The holder's own processes (Ray Train workers, Ray Data tasks) get ``lease.fence`` (picklable) and prove the lease
before each commit; see fence.py.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from storage import fs as storage_fs
from storage import lease_record
from storage.fence import Fence
from storage.lease_record import (
    BEAT_FRACTION,
    HELD,
    MAX_STALE_SECONDS,
    STALE_ENV,
    STALE_SECONDS,
    STEP_DOWN_FRACTION,
    LeaseHeld,
    LeaseLost,
    describe,
    held,
    holder_beat_age,
    holder_gone,
    identity,
    iso,
    now,
    stale_seconds,
)
from storage.lease_store import Version, store_for

__all__ = ["STALE_ENV", "STALE_SECONDS", "Lease", "LeaseHeld", "LeaseLost", "OUTPUT_LEASE", "forget_released", "held",
           "holding",
           "lease_url_beside", "output_lease", "stale_seconds"]

log = logging.getLogger(__name__)

def lease_url_beside(target: str) -> str:
    """The lease of a folder that is replaced as a whole (an export, a training run's folder): a sibling
    ``<target>.lease.json`` (an object on S3, a folder of numbered records on local disk), which the folder's
    replacement or removal does not touch."""
    trimmed = target.rstrip("/")
    if not trimmed or (storage_fs.is_url(trimmed) and "/" not in trimmed.split("://", 1)[1]):
        raise ValueError(f"{target}: name a folder inside the bucket or disk, not its root")
    return trimmed + ".lease.json"


class Lease:
    """The lease at ``url`` for the writer of ``target`` (``what`` says who we are in messages). Use as a context
    manager, or ``acquire()``/``release()``. ``on_lost(message)`` is how the holder steps down (default:
    ``lease_record.exit_process``, the process exits with status 2)."""

    def __init__(self, url: str, target: str, what: str, endpoint_url: str | None = None,
                 hint: str = "or write somewhere else", on_lost: Callable[[str], None] | None = None) -> None:
        self.url, self.target, self.what, self.hint = url, target.rstrip("/"), what, hint
        self.endpoint_url, self.on_lost = endpoint_url, on_lost
        self.token = uuid.uuid4().hex
        self.stale = stale_seconds()
        self.started = now()
        self._store = store_for(url, endpoint_url)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.last_ok = time.monotonic()  # when the last successful write of our record was sent
        self.lost = False
        self._lost_lock = threading.Lock()
        self._told = threading.Event()  # the step-down's one line is out: no thread ends the process before it
        self.record: dict[str, Any] = {}

    # ---- the record ----------------------------------------------------------------------------------------------

    def _new_record(self, before: dict[str, Any] | None, version: Version | None) -> dict[str, Any]:
        commits = (before or {}).get("commits") or {}
        legacy = None
        if before is None:
            legacy = "create"  # replaced by the creation's store time right after (see _acquire)
        elif not any(commits.values()) and before.get("legacy_before") is not None:
            legacy = before["legacy_before"]
        return {
            "token": self.token, "generation": int((before or {}).get("generation") or 0) + 1,
            "write_id": uuid.uuid4().hex, "prev": (before or {}).get("write_id"), "writer": "holder",
            **identity(), "what": self.what, "target": self.target, "started": iso(self.started),
            "stale_seconds": self.stale, "commits": commits, "legacy_before": legacy,
            "took_over_from": describe(before) if before and before.get("token") else None,
        }

    def _stale_for(self, record: dict[str, Any]) -> float:
        """The holder beats every S/4 of *its* stale time: a taker configured shorter must not take over a live
        holder configured longer, so the longer of the two counts."""
        try:
            theirs = float(record.get("stale_seconds") or 0)
        except (TypeError, ValueError):
            theirs = 0.0
        if not math.isfinite(theirs):  # a record's NaN would make every comparison false: the holder never stale
            theirs = 0.0
        return max(self.stale, min(theirs, MAX_STALE_SECONDS))

    # ---- acquire, beat, release ----------------------------------------------------------------------------------

    def acquire(self) -> Lease:
        """Take the lease, or raise LeaseHeld (one line: who holds it, what to do); a store that refuses us (a
        missing bucket, credentials, no conditional writes) is a ValueError naming the URL and the usual fix."""
        try:
            self._store.check_conditional_writes(self.endpoint_url)
            self._acquire()
        except (ValueError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - botocore/aiohttp/OS errors: name the URL and the fix
            raise storage_fs.storage_error(self.target, e, "write to") from e
        HELD[self.target] = self
        for name, fn in (("beat", self._beat), ("watchdog", self._watchdog)):
            thread = threading.Thread(target=fn, name=f"lease-{name}-{os.path.basename(self.target)}", daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("holding the writer lease %s", self.url)
        return self

    def _acquire(self) -> None:
        for _ in range(5):  # a holder may release or beat between our read and our write: look again
            got = self._store.read()
            sent = time.monotonic()
            if got is None:
                record = self._new_record(None, None)
                if self._store.create(record):
                    self.last_ok = sent
                    self._date_legacy(record)
                    return
                continue
            before, version = got
            if not before.get("token") and not before.get("foreign"):
                record = self._new_record(before, version)
                if self._store.replace(record, version):
                    self.last_ok, self.record = sent, record
                    return
                continue
            gone = holder_gone(before)
            age = holder_beat_age(before, version, upper=False)
            stale = self._stale_for(before)
            if gone is None and age <= stale:
                raise LeaseHeld(self._refusal(before, version))
            if gone is None:  # stale by the store's clock; confirmed on ours before anything is taken
                now_got = self._unchanged_for(version, stale)
                if now_got is not None:  # the record changed while we watched
                    if now_got[0].get("token") == before.get("token"):  # its holder beat: alive
                        raise LeaseHeld(self._refusal(*now_got))
                    continue  # released or taken by someone else meanwhile: look again
                sent = time.monotonic()  # our record's write is sent now, after the watch
            record = self._new_record(before, version)
            if self._store.replace(record, version):
                self.last_ok, self.record = sent, record
                why = gone if gone else f"whose heartbeat stopped {age:.0f} s ago (more than {stale:.0f} s: it died," \
                                        " was killed or is cut off)"
                log.warning("%s: took over from host %s, pid %s (%s), started %s, %s%s; what it committed is kept,"
                            " anything it wrote after is not resumed from", self.target, before.get("host"),
                            before.get("pid"), before.get("process") or "unknown process", before.get("started"),
                            why, ": at once" if gone else "")
                return
        got = self._store.read()
        raise LeaseHeld(self._refusal(*got) if got else f"{self.target}: could not take the writer lease {self.url};"
                        " try again")

    def _unchanged_for(self, version: Version, stale: float) -> tuple[dict[str, Any], Version] | None:
        """Watch the record for ``stale`` seconds of this process's monotonic clock: None when its version (the S3
        ETag, the local generation) stayed ``version`` all along, else what it changed to. A takeover needs this as
        well as the store's dates: the store's nodes may date a live holder's beats with clocks that disagree, but
        a holder that beats every S/4 cannot leave its record unchanged for S of the taker's own time."""
        log.info("%s: the writer lease %s looks stale by the store's clock; watching it for %.0f s before taking"
                 " over", self.target, self.url, stale)
        began = time.monotonic()
        while (left := stale - (time.monotonic() - began)) > 0:
            time.sleep(min(left, max(stale * BEAT_FRACTION / 2, 0.05)))
            got = self._store.read()
            if got is None:
                return {}, version
            if got[1].tag != version.tag:
                return got
        return None

    def _date_legacy(self, record: dict[str, Any]) -> None:
        """A record created where there was none: output already in the target was written without commits (an
        older version of this tool) and is trusted if it is older than the record, by the store's clock."""
        got = self._store.read()
        if got is None or got[0].get("write_id") != record["write_id"]:
            self.record = record
            return
        dated = {**record, "legacy_before": got[1].modified, "write_id": uuid.uuid4().hex,
                 "prev": record["write_id"]}
        sent = time.monotonic()
        if self._store.replace(dated, got[1]):
            self.last_ok, self.record = sent, dated
        else:
            self.record = record

    def renew(self) -> bool:
        """One beat: rewrite our record if it is still ours. False when it is not (we were taken over)."""
        for _ in range(3):
            got = self._store.read()
            if got is None or got[0].get("token") != self.token:
                self.lose(self._lost_message(got[0] if got else None))
                return False
            record, version = got
            beat = {k: v for k, v in record.items() if k != "holder_beat"}
            beat.update(write_id=uuid.uuid4().hex, prev=record.get("write_id"), writer="holder")
            sent = time.monotonic()
            if self._store.replace(beat, version):
                self.last_ok, self.record = sent, beat
                return True
            # A writer of ours committed between our read and our write: read again.
        return True

    def _beat(self) -> None:
        period = self.stale * BEAT_FRACTION
        while not self._stop.wait(period):
            try:
                if not self.renew():
                    return
            except Exception as e:  # noqa: BLE001 - the watchdog steps down if this goes on for 3/4 of the stale time
                log.warning("lease %s: heartbeat failed (%s: %s); retrying in %.0f s", self.url, type(e).__name__,
                            str(e)[:300], period)

    def _watchdog(self) -> None:
        """Steps the holder down when its beats have failed for 3/4 of the stale time, however long a single beat is
        stuck in retries: the takeover comes only after the whole stale time."""
        limit = self.stale * STEP_DOWN_FRACTION
        while not self._stop.wait(min(1.0, self.stale / 16)):
            silent = time.monotonic() - self.last_ok
            if silent > limit:
                self.step_down_silent(silent)
                return

    def step_down_silent(self, silent: float) -> None:
        """Step down after ``silent`` seconds without a successful beat, naming the job that took over when the
        store says so within a moment (a stalled process woken up finds its taker), else why."""
        now_held = self._who_holds(timeout=min(2.0, self.stale / 8))
        if now_held is not None and now_held[0] is not None and now_held[0].get("token") != self.token:
            self.lose(self._lost_message(now_held[0]))
            return
        self.lose(f"{self.target}: this {self.what} could not renew its writer lease {self.url} for {silent:.0f} s"
                  " (the store unreachable, slow or refusing, or this process stalled); stopping now, before another"
                  f" job may take it over ({self.stale:.0f} s after the last renewal)")

    def _who_holds(self, timeout: float) -> tuple[dict[str, Any] | None] | None:
        """(the record now,) when the store answers within ``timeout`` (a stepping-down holder names its taker);
        None when it does not (a partition: the step-down does not wait for it)."""
        answer: list = []

        def read() -> None:
            with contextlib.suppress(Exception):
                got = self._store.read()
                answer.append(got[0] if got else None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        return (answer[0],) if answer else None

    def _lost_message(self, record: dict[str, Any] | None) -> str:
        return (f"{self.target}: this {self.what} lost its writer lease to {describe(record)} (this job stalled or"
                f" was cut off for more than {self.stale:.0f} s and was taken over); stopping without writing more")

    def lose(self, message: str) -> None:
        """Step down: one ERROR line (who holds the lease now), then ``on_lost`` (by default the process exits). Every
        thread that finds the lease lost goes through ``on_lost``, not only the first: a main thread must not go on
        to write (an MLflow run's end) while the watchdog is still saying why it steps down."""
        with self._lost_lock:
            first, self.lost = not self.lost, True
        self._stop.set()
        if first:
            try:
                log.error("%s", message)
            finally:
                self._told.set()
        else:
            # Another thread is saying why (formatting and redacting its line): the process must not end under it
            # (a stalled driver woken up lost its lease in two threads at once and exited without the line).
            self._told.wait(5.0)
        (self.on_lost or lease_record.exit_process)(message)

    def release(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=10)
        if HELD.get(self.target) is self:
            del HELD[self.target]
        if self.lost:
            return
        try:
            for _ in range(3):
                got = self._store.read()
                if got is None or got[0].get("token") != self.token:
                    return
                record, version = got
                released = {k: v for k, v in record.items() if k != "holder_beat"}
                released.update(token=None, write_id=uuid.uuid4().hex, prev=record.get("write_id"),
                                writer="release", released=iso(now()))
                if self._store.replace(released, version):
                    return
        except Exception as e:  # noqa: BLE001 - an unreleased lease goes stale and is taken over: say so, go on
            log.warning("could not release the lease %s (%s); the next writer takes it over after %.0f s", self.url,
                        e, self.stale)

    @property
    def fence(self) -> Fence:
        """What the job's writers (other processes included) prove the lease with: storage/fence.py."""
        return Fence(self.url, self.endpoint_url, self.token, self.target, self.what, self.stale)

    def _refusal(self, record: dict[str, Any], version: Version) -> str:
        age = max(0.0, holder_beat_age(record, version, upper=False))
        return (f"{self.target} is being written by another {record.get('what', 'writer')} (host"
                f" {record.get('host')}, pid {record.get('pid')} ({record.get('process') or 'unknown process'}),"
                f" started {record.get('started')}, heartbeat {age:.0f} s ago): wait for it to finish (a holder that"
                f" died is taken over {self._stale_for(record):.0f} s after its last heartbeat, at once when it ran"
                f" on this host), {self.hint}")

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def forget_released(url: str, endpoint_url: str | None = None) -> bool:
    """Remove a lease's record once it is released, for an output removed as a whole after its job (fine-tuning's
    temporary checkpoints): True when there is none left. A held record is left alone."""
    store = store_for(url, endpoint_url)
    got = store.read()
    if got is None:
        return True
    if got[0].get("token"):
        return False
    return store.delete(got[1])


WAIT_POLL_SECONDS = 2.0


@contextlib.contextmanager
def holding(url: str, target: str, what: str, endpoint_url: str | None = None,
            hint: str = "or write somewhere else", wait: float = 0.0,
            on_lost: Callable[[str], None] | None = None) -> Iterator[Lease]:
    """``with holding(...)``: the lease for the block, released on exit and on error. ``wait``: seconds to wait
    for a live holder to finish before refusing (an export after hours of training waits for another export's
    few seconds rather than failing)."""
    deadline, told = time.monotonic() + wait, False
    while True:
        try:
            lease = Lease(url, target, what, endpoint_url, hint, on_lost).acquire()
            break
        except LeaseHeld as e:
            if time.monotonic() + WAIT_POLL_SECONDS > deadline:
                raise
            if not told:
                log.info("waiting up to %.0f s for the other writer: %s", deadline - time.monotonic(), e)
                told = True
            time.sleep(WAIT_POLL_SECONDS)
    try:
        yield lease
    finally:
        lease.release()


OUTPUT_LEASE = "_writer.lease.json"


def output_lease(output: str, what: str = "dataset build", ep: str | None = None,
                 hint: str = "or use another --output") -> contextlib.AbstractContextManager[Lease]:
    """The lease of a folder a job fills in place (a dataset build's --output): inside it."""
    return holding(storage_fs.join(output, OUTPUT_LEASE), output, what, ep, hint)

