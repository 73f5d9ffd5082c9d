"""The fence: how a process that writes for a job (its driver, a Ray Train worker, a Ray Data task, an export)
proves, right before it commits, that the job still holds the output's writer lease (storage/lease.py).

``Fence`` is a small picklable value (the lease's URL, endpoint, token, target and stale time S) handed to every
process that writes. It offers three things:

- ``check()``: read the record (one GET) and refuse unless it still names our token and the holder's last beat is at
  most S/2 old by the store's clock; a proof is reused for S/8, so a writer that commits often pays one GET per S/8.
  A holder stalled, partitioned or killed stops beating; its writers stop proving within S/2 (+ S/8) of its last
  beat, before any other job may take over (past S).
- ``commit(kind, entry)``: the commit itself, a conditional write of the record that adds ``entry`` (a checkpoint's
  name, step and digest) to what was committed under the lease. It fails if anyone else changed the record in
  between, so nothing is ever committed after a takeover; a taker resumes only from committed entries.
- ``watch()``: a thread that proves the lease every S/8 and ends the process (status 2, one line) when it cannot: a
  Ray Train worker stops training when its job's driver is stopped, even between checkpoints; ``watching()`` does
  it for one block (each Ray Data task of a build: pipeline/ray_data/guard.py).

A proof that fails raises ``LeaseLost`` (one line naming who holds the lease now); in the process that holds the
lease itself, the lease steps down first (its ``on_lost``: by default the process exits).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from storage import lease_record
from storage.lease_record import (
    KEEP_COMMITS,
    PROOF_REUSE_FRACTION,
    STEP_DOWN_FRACTION,
    WRITER_LIMIT_FRACTION,
    LeaseLost,
    describe,
    held,
    holder_beat_age,
    holder_beat_time,
)
from storage.lease_store import Version, store_for

log = logging.getLogger(__name__)

COMMIT_ATTEMPTS = 5  # a commit races the holder's beats and other commits: each loss is one more read and write


class Fence:
    """See the module docstring. Pickled to other processes with its five fields only."""

    def __init__(self, url: str, endpoint_url: str | None, token: str, target: str, what: str, stale: float) -> None:
        self.url, self.endpoint_url, self.token = url, endpoint_url, token
        self.target, self.what, self.stale = target, what, stale
        self._store = None
        self._proved_at = float("-inf")  # monotonic time a proof was sent (this process)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("url", "endpoint_url", "token", "target", "what", "stale")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    def __repr__(self) -> str:
        return f"Fence({self.url!r}, token {self.token[:8]})"

    @property
    def store(self):
        if self._store is None:
            self._store = store_for(self.url, self.endpoint_url)
        return self._store

    def _lease(self):
        lease = held(self.target)
        return lease if lease is not None and lease.token == self.token else None

    def _lost(self, message: str) -> LeaseLost:
        lease = self._lease()
        if lease is not None:
            lease.lose(message)  # the holder steps down (by default the process exits here)
        return LeaseLost(message)

    # ---- proving -------------------------------------------------------------------------------------------------

    def _prove(self) -> tuple[dict[str, Any], Version]:
        lease = self._lease()
        if lease is not None:  # the holder's own process: what it knows of its beats decides first, without I/O
            silent = time.monotonic() - lease.last_ok
            if lease.lost or silent > self.stale * STEP_DOWN_FRACTION:
                lease.step_down_silent(silent)  # by default the process exits here
                raise LeaseLost(f"{self.target}: this {self.what} has not renewed its writer lease for {silent:.0f} s"
                                " (stalled or cut off); stopping without writing more")
        sent = time.monotonic()
        got = self.store.read()
        if got is None or got[0].get("token") != self.token:
            raise self._lost(f"{self.target}: this {self.what} lost its writer lease to "
                             f"{describe(got[0] if got else None)}; stopping without writing more")
        record, version = got
        age = holder_beat_age(record, version, upper=True)
        if age > self.stale * WRITER_LIMIT_FRACTION:
            raise self._lost(f"{self.target}: the {self.what}'s holder (host {record.get('host')}, pid "
                             f"{record.get('pid')}) has not renewed the writer lease for {age:.0f} s (stalled, killed"
                             f" or cut off); this writer stops before another job may take over")
        with self._lock:
            self._proved_at = max(self._proved_at, sent)
        return record, version

    def check(self, fresh: bool = False) -> None:
        """Prove the lease before a write (a GET at most every S/8; every time with ``fresh``, before something as
        big as a checkpoint); LeaseLost when it cannot be proved."""
        lease = self._lease()
        if lease is not None and lease.lost:
            raise LeaseLost(f"{self.target}: this {self.what} has lost its writer lease; stopping")
        if not fresh and time.monotonic() - self._proved_at < self.stale * PROOF_REUSE_FRACTION:
            return
        self._prove()

    def commit(self, kind: str, entry: dict[str, Any]) -> list[dict[str, Any]]:
        """Add ``entry`` (with a ``name``) to the lease's committed ``kind`` by a conditional write of the record:
        done only if the record is still ours and its holder alive; LeaseLost otherwise. Returns the committed
        entries of ``kind``, oldest first."""
        for _ in range(COMMIT_ATTEMPTS):
            sent = time.monotonic()
            record, version = self._prove()
            commits = dict(record.get("commits") or {})
            entries = [e for e in commits.get(kind, []) if e.get("name") != entry.get("name")] + [entry]
            commits[kind] = entries[-KEEP_COMMITS:]
            new = {**record, "commits": commits, "write_id": uuid.uuid4().hex, "prev": record.get("write_id"),
                   "writer": "commit", "holder_beat": holder_beat_time(record, version)}
            if self.store.replace(new, version):
                with self._lock:
                    self._proved_at = max(self._proved_at, sent)
                return commits[kind]
            # The holder beat, or another commit landed, between our read and our write: prove again.
        raise OSError(f"could not commit to the writer lease {self.url} in {COMMIT_ATTEMPTS} attempts (it changes "
                      "too often); try again")

    def committed(self, kind: str) -> tuple[list[dict[str, Any]], float | None]:
        """(entries committed under the lease, newest last; ``legacy_before``): output of ``kind`` that is not among
        the entries is trusted only when there are none and it was written before ``legacy_before`` (store time:
        output of a version of this tool without commits, found when the record was first created)."""
        record, _ = self._prove()
        entries = list((record.get("commits") or {}).get(kind, []))
        legacy = record.get("legacy_before")
        return entries, (float(legacy) if isinstance(legacy, (int, float)) and not entries else None)

    # ---- a watcher -----------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def watching(self, on_lost=None) -> Iterator[None]:
        """``watch()`` for the length of a block: a build's Ray Data task (a write that takes minutes) stops when its
        job's lease is lost, not only at its commit. The watcher ends with the block, so a worker process that later
        runs another job's tasks is not ended for this one's lease."""
        stop = self.watch(on_lost)
        try:
            yield
        finally:
            stop.set()

    def watch(self, on_lost=None) -> threading.Event:
        """Prove the lease every S/8 in a daemon thread; when it cannot be proved, log the one line and call
        ``on_lost(message)`` (default: exit the process with status 2). Set the returned event to stop watching."""
        stop = threading.Event()
        on_lost = on_lost or lease_record.exit_process
        if self._proved_at == float("-inf"):
            self._proved_at = time.monotonic()  # the watch starts from a live job: count from now

        def loop() -> None:
            while not stop.wait(self.stale * PROOF_REUSE_FRACTION):
                try:
                    self._prove()
                except LeaseLost as e:
                    log.error("%s", e)
                    on_lost(str(e))
                    return
                except Exception as e:  # noqa: BLE001 - the store unreachable (a partition): stop once unprovable
                    silent = time.monotonic() - self._proved_at
                    log.warning("could not check the writer lease %s (%s: %s)", self.url, type(e).__name__,
                                str(e)[:300])
                    if silent > self.stale * WRITER_LIMIT_FRACTION:
                        message = (f"{self.target}: this writer could not prove the {self.what}'s writer lease for"
                                   f" {silent:.0f} s (the store unreachable); stopping before another job may take"
                                   " over")
                        log.error("%s", message)
                        on_lost(message)
                        return

        threading.Thread(target=loop, name="fence-watch", daemon=True).start()
        return stop
