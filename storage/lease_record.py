"""What a writer lease's record holds and how its age is judged (storage/lease.py holds the lease,
storage/fence.py lets the processes that write prove it, storage/lease_store.py stores the record).

A record names its holder (host, the kernel's boot id, the pid namespace, pid and the process's start time, the
program, what it writes), a random ``token`` per holding (None once released), a ``generation`` (one more per
holder), ``write_id``/``prev`` (which write this version is, which it replaced), ``writer`` (``holder``: the holder's
own heartbeat; ``commit``: a writer's commit; ``release``), ``holder_beat`` (on a commit: when the holder last beat,
by the store's clock), ``commits`` (per kind, the last entries writers committed under the lease: a run's
checkpoints) and ``legacy_before`` (the store time before which output written without commits is trusted).

Ages are the store's: a version's modification time against the store's clock when it was read (S3's
``LastModified`` and ``Date``; a local file system's mtimes), never two hosts' wall clocks. Times, as fractions of the
stale time S (60 s, or ``BERT_LEASE_STALE_SECONDS``): the holder beats every S/4; a writer proves the lease only while
the holder's last beat is at most S/2 old, and reuses a proof for S/8; the holder steps down (exits) when its own
beats have failed for 3/4 S; another job takes over only past S. So a writer that can no longer prove the lease has
stopped before anyone else may write.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import os
import socket
import sys
import time
from typing import Any

from storage.lease_store import SCRATCH, Version

STALE_SECONDS = 60.0
STALE_ENV = "BERT_LEASE_STALE_SECONDS"
BEAT_FRACTION = 0.25
WRITER_LIMIT_FRACTION = 0.5
PROOF_REUSE_FRACTION = 0.125
STEP_DOWN_FRACTION = 0.75
KEEP_COMMITS = 16  # per kind: a run keeps a few checkpoints; older entries name folders long removed
EXIT_LEASE_LOST = 2  # what a job that lost its lease exits with (a user-facing condition, like a refusal)


MIN_STALE_SECONDS, MAX_STALE_SECONDS = 1.0, 24 * 3600.0  # below, a beat (S/4) is faster than a store answers;
# above, a dead holder blocks its output for over a day. NaN would switch every time limit off (every comparison
# with it is false) and spin the heartbeat; inf would stop the heartbeat thread.


def stale_seconds() -> float:
    """The stale time in force: ``BERT_LEASE_STALE_SECONDS`` when set (tests, operators), else STALE_SECONDS. A
    value that is not a finite number of seconds in [MIN_STALE_SECONDS, MAX_STALE_SECONDS] is refused (ValueError
    naming the variable), before any lease is taken."""
    raw = os.environ.get(STALE_ENV)
    if not raw:
        return STALE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{STALE_ENV}={raw!r}: give a number of seconds") from None
    if not math.isfinite(value) or not MIN_STALE_SECONDS <= value <= MAX_STALE_SECONDS:
        raise ValueError(f"{STALE_ENV}={raw!r}: give a number of seconds from {MIN_STALE_SECONDS:g} to "
                         f"{MAX_STALE_SECONDS:g} (the default is {STALE_SECONDS:g})")
    return value


class LeaseHeld(ValueError):
    """Another live writer holds the lease (a user-facing error: its message says who and what to do)."""


class LeaseLost(ValueError):
    """This writer can no longer prove it holds the lease (taken over, or its holder stopped renewing): one line
    naming who holds it now. A ValueError: jobs end on it with that line and a non-zero exit, no traceback."""


HELD: dict[str, Any] = {}  # the leases this process holds, by target: fences and launchers find theirs here


def held(target: str):
    """The lease (storage/lease.py) this process holds for ``target`` (a run folder, an output), if any."""
    return HELD.get(target.rstrip("/"))


def exit_process(message: str) -> None:
    """The default step-down: the job stops writing by ending, at once (the line was logged by the caller): once no
    thread is inside a local lease record's scratch file (a clock probe ended by os._exit would stay in the folder)."""
    SCRATCH.acquire(timeout=10.0)  # one local file operation; a store hung past that does not keep the process up
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(EXIT_LEASE_LOST)


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def boot_id() -> str | None:
    return _read("/proc/sys/kernel/random/boot_id")


def pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid, it names one
    process, not whichever later reuses the number."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    try:
        return stat.rsplit(")", 1)[1].split()[19]
    except IndexError:
        return None


def identity() -> dict[str, Any]:
    """This process as a holder names itself. The program only, not its arguments: they may hold URLs with
    credentials, and the record is readable by whoever can read the storage."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot_id": boot_id(), "pid_ns": pid_namespace(), "pid": pid,
            "pid_start": process_start(pid),
            "process": os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"}


def holder_gone(record: dict[str, Any]) -> str | None:
    """Why the record's holder is known to be gone (same host, same boot, same pid namespace, and its pid is not
    running or is another process now); None when that cannot be told from here."""
    me = identity()
    if not record.get("token") or record.get("host") != me["host"] or not record.get("boot_id"):
        return None
    if record.get("boot_id") != me["boot_id"] or record.get("pid_ns") != me["pid_ns"]:
        return None  # another machine or container with the same name: its processes are not ours to see
    try:
        pid = int(record["pid"])
    except (KeyError, TypeError, ValueError):
        return None
    start = process_start(pid)
    if start is None:
        return f"its process {pid} on this host has exited"
    if record.get("pid_start") and start != record["pid_start"]:
        return f"its process {pid} on this host has exited (the pid now names another process)"
    return None


def holder_beat_age(record: dict[str, Any], version: Version, upper: bool) -> float:
    """How long ago, by the store's clock, the holder last beat: the version's own age when the holder wrote it,
    else from the ``holder_beat`` a writer's commit carried. ``upper``: the most it can be (else the least)."""
    slack = version.granularity if upper else -version.granularity
    if record.get("writer") in (None, "holder"):
        return version.now - version.modified + slack
    try:
        return version.now - float(record["holder_beat"]) + slack
    except (KeyError, TypeError, ValueError):
        return version.now - version.modified + slack


def holder_beat_time(record: dict[str, Any], version: Version) -> float:
    """The store time of the holder's last beat (what a commit carries forward)."""
    if record.get("writer") in (None, "holder") or "holder_beat" not in record:
        return version.modified
    return float(record["holder_beat"])


def describe(record: dict[str, Any] | None) -> str:
    """The holder a record names, for messages: host, pid, program, what it writes, since when."""
    if record is None:
        return "nobody (the record was deleted)"
    if not record.get("host"):
        return "nobody (released)"
    return (f"{record.get('what', 'writer')} on host {record.get('host')}, pid {record.get('pid')}"
            f" ({record.get('process') or 'unknown process'}), started {record.get('started')}"
            + ("" if record.get("token") else ", which has finished with it since"))


def now() -> float:
    return time.time()  # only to date records for people; ages are the store's
