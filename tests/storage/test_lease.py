"""The writer lease (storage/lease.py) on local disk and on a real S3-protocol server (moto on loopback): one
holder at a time, a one-line refusal naming the holder, released on exit and on error, heartbeats that keep a live
holder, a killed holder taken over once its heartbeat is older than the stated time (at once when it ran on this
host), and the hostile cases of issue 30: a holder that cannot renew steps down by itself (no SIGINT needed), a paused
heartbeat never overwrites a taker's record, a store that ignores conditional writes is refused, and a holder whose
clock runs behind is not taken over early."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from storage.lease import STALE_ENV, Lease, LeaseHeld, holding, lease_url_beside, stale_seconds
from storage.lease_store import StoreRefused, store_for

REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    """(lease URL, target, endpoint URL) on local disk or in a fresh bucket."""
    if request.param == "local":
        yield str(tmp_path / "out" / "_writer.lease.json"), str(tmp_path / "out"), None
    else:
        endpoint, bucket = request.getfixturevalue("s3_bucket")
        yield f"s3://{bucket}/out/_writer.lease.json", f"s3://{bucket}/out", endpoint


def record(url: str, ep: str | None) -> dict:
    got = store_for(url, ep).read()
    assert got is not None, f"no lease record at {url}"
    return got[0]


class Steps:
    """An ``on_lost`` that records the step-down instead of ending the test process."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.at: float | None = None

    def __call__(self, message: str) -> None:
        self.messages.append(message)
        self.at = time.monotonic()


def _holder(url: str, target: str, ep: str | None, prelude: str = "", after: str = "") -> subprocess.Popen:
    """A holder in its own process (the default step-down: exit 2), printing 'held' once it holds the lease."""
    code = textwrap.dedent(prelude) + textwrap.dedent(f"""
        import logging, sys, time
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        from storage.lease import Lease
        lease = Lease({url!r}, {target!r}, 'dataset build', {ep!r}).acquire()
        print('held', flush=True)
    """) + textwrap.dedent(after) + "\ntime.sleep(600)\n"
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _held(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline().strip()
    assert line == "held", proc.stderr.read() if proc.poll() is not None else line


def test_one_holder_and_a_one_line_refusal(where):
    url, target, ep = where
    with holding(url, target, "dataset build", ep, hint="or use another --output") as first:
        with pytest.raises(LeaseHeld) as refused:
            Lease(url, target, "dataset build", ep).acquire()
        message = str(refused.value)
        assert "\n" not in message
        assert f"pid {os.getpid()}" in message and "host " in message and "started " in message
        assert message.startswith(f"{target} is being written by another dataset build")
        assert record(url, ep)["token"] == first.token  # the refused writer left the record as it was
    released = record(url, ep)
    assert released["token"] is None and released["writer"] == "release"  # kept, marked released
    with holding(url, target, "dataset build", ep) as again:  # and free for the next writer
        assert record(url, ep)["token"] == again.token
        assert record(url, ep)["generation"] == released["generation"] + 1


def test_released_on_error(where):
    url, target, ep = where
    with pytest.raises(RuntimeError, match="boom"):
        with holding(url, target, "pre-training run", ep):
            raise RuntimeError("boom")
    assert record(url, ep)["token"] is None


def test_heartbeat_keeps_a_live_holder(where, monkeypatch):
    url, target, ep = where
    # Short enough to pass it several times, long enough that a loaded machine's slow beats never look stale.
    monkeypatch.setenv(STALE_ENV, "4")
    steps = Steps()
    with holding(url, target, "export", ep, on_lost=steps):
        time.sleep(6)  # past the stale time: only the heartbeats keep the record fresh
        with pytest.raises(LeaseHeld, match=r"heartbeat [0-3] s ago"):
            Lease(url, target, "export", ep).acquire()
    assert not steps.messages


def test_a_killed_holder_elsewhere_is_taken_over_after_the_stated_time(where, monkeypatch, caplog):
    """A holder whose record names another machine (its process cannot be looked at from here) is taken over only
    once its heartbeat, by the store's clock, is older than the stale time."""
    url, target, ep = where
    monkeypatch.setenv(STALE_ENV, "4")  # the holder inherits it
    holder = _holder(url, target, ep, prelude="""
        import socket
        socket.gethostname = lambda: 'another-host'
    """)
    try:
        _held(holder)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        killed_at = time.monotonic()
        with pytest.raises(LeaseHeld, match=f"pid {holder.pid} "):  # its last heartbeat is still recent
            Lease(url, target, "dataset build", ep).acquire()
        time.sleep(max(0.0, killed_at + 6.5 - time.monotonic()))  # S3 dates are to the second: up to S + 2 s
        with caplog.at_level(logging.WARNING, logger="storage.lease"):
            with holding(url, target, "dataset build", ep) as taker:
                assert record(url, ep)["token"] == taker.token
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("took over from host another-host" in w and f"pid {holder.pid} " in w for w in warned), warned
    finally:
        if holder.poll() is None:
            holder.kill()


def test_a_dead_holder_on_this_host_is_taken_over_at_once(where, monkeypatch, caplog):
    """Item 7: the record names this host, its boot, its pid namespace, the pid and the process's start time; once
    that process is gone the next writer takes over at once and says so (no minute's wait after a SIGKILL)."""
    url, target, ep = where
    monkeypatch.setenv(STALE_ENV, "60")
    holder = _holder(url, target, ep)
    try:
        _held(holder)
        with pytest.raises(LeaseHeld, match=f"pid {holder.pid} "):  # alive: refused
            Lease(url, target, "dataset build", ep).acquire()
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        with caplog.at_level(logging.WARNING, logger="storage.lease"):
            with holding(url, target, "dataset build", ep) as taker:
                assert record(url, ep)["token"] == taker.token
    finally:
        if holder.poll() is None:
            holder.kill()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"pid {holder.pid} " in w and "has exited" in w and "at once" in w for w in warned), warned


def test_a_holder_stopped_past_the_stale_time_exits_without_sigint(where, monkeypatch):
    """Items 3 and 4: a holder that ignores SIGINT (a job started with & from a script) is SIGSTOPped past the stale
    time and taken over; woken, it must not write its record over the taker's (its heartbeat's write is conditional)
    and must end by itself, non-zero, with one line naming the job that took over."""
    url, target, ep = where
    monkeypatch.setenv(STALE_ENV, "4")
    holder = _holder(url, target, ep, prelude="""
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    """)
    try:
        _held(holder)
        holder.send_signal(signal.SIGSTOP)
        time.sleep(7)  # past the stale time by the store's clock (S3 dates are to the second: up to S + 2 s)
        with holding(url, target, "dataset build", ep) as taker:
            holder.send_signal(signal.SIGCONT)
            holder.wait(timeout=20)
            assert record(url, ep)["token"] == taker.token
        err = holder.stderr.read()
    finally:
        if holder.poll() is None:
            holder.send_signal(signal.SIGCONT)
            holder.kill()
    assert holder.returncode == 2, err
    (line,) = [x for x in err.splitlines() if x.startswith("ERROR")]
    assert "lost its writer lease to dataset build on host" in line and f"pid {os.getpid()} " in line, line


def test_a_paused_heartbeat_never_overwrites_the_takers_record(tmp_path, monkeypatch):
    """Item 4, on local disk: the holder's heartbeat is paused between reading its record and writing it (the file
    opened, then the process stalls past the stale time); a taker takes over meanwhile. When the heartbeat goes on it
    must find the record changed, not replace it, and the holder steps down."""
    monkeypatch.setenv(STALE_ENV, "3")
    url, target = str(tmp_path / "out" / "_writer.lease.json"), str(tmp_path / "out")
    holder = _holder(url, target, None, prelude="""
        import builtins, time
        _open, armed = builtins.open, []
        def slow_open(f, mode='r', *a, **k):
            handle = _open(f, mode, *a, **k)
            if armed and mode == 'rb' and 'lease' in str(f) and '.write-' not in str(f):
                armed.clear()
                time.sleep(6)  # the record is open: a stalled heartbeat
            return handle
        builtins.open = slow_open
    """, after="armed.append(1)")
    try:
        _held(holder)
        time.sleep(4.5)  # the holder's next beat opened the record and stalled; its last beat is stale
        with holding(url, target, "dataset build", None) as taker:
            holder.wait(timeout=20)  # the stalled beat goes on, finds the record changed, and the holder exits
            assert record(url, None)["token"] == taker.token
    finally:
        if holder.poll() is None:
            holder.kill()
    assert holder.returncode == 2, holder.stderr.read()


def test_a_holder_that_cannot_renew_steps_down_before_anyone_takes_over(s3_bucket, monkeypatch):
    """Item 2: the lease record answers 503 for 30 s (the store throttling that key, a partition). The holder's beats
    sit in retries; its watchdog steps it down within 3/4 of the stale time of its last renewal, and a taker gets the
    lease only after the whole stale time, when the holder has already stopped."""
    from _fault_proxy import FaultProxy

    endpoint, bucket = s3_bucket
    url, target = f"s3://{bucket}/out/_writer.lease.json", f"s3://{bucket}/out"
    monkeypatch.setenv(STALE_ENV, "6")
    steps = Steps()
    with FaultProxy(endpoint, slow_every=10**9, drop_every=10**9) as proxy:
        lease = Lease(url, target, "dataset build", proxy.url, on_lost=steps).acquire()
        try:
            renewed = lease.last_ok
            proxy.unavailable("_writer.lease.json", seconds=30)
            deadline = time.monotonic() + 20
            while not steps.messages and time.monotonic() < deadline:
                time.sleep(0.2)
            assert steps.messages, "the holder never stepped down"
            assert steps.at - renewed <= 6 * 0.75 + 1.5, steps.at - renewed
            assert "could not renew its writer lease" in steps.messages[0] and "\n" not in steps.messages[0]
            assert lease.lost
            # The taker, talking to the store directly, waits for the whole stale time of the last renewal.
            with pytest.raises(LeaseHeld):
                Lease(url, target, "dataset build", endpoint).acquire()
            time.sleep(max(0.0, renewed + 6 + 2.5 - time.monotonic()))
            with holding(url, target, "dataset build", endpoint) as taker:
                assert record(url, endpoint)["token"] == taker.token
        finally:
            lease.release()


def test_a_store_that_ignores_conditional_writes_is_refused(s3_bucket):
    """Item 5: a store (here moto behind a proxy that drops If-None-Match/If-Match) that would let a second writer in
    is refused at the first acquire, in one line naming --endpoint-url, before any record is written."""
    from _fault_proxy import FaultProxy

    endpoint, bucket = s3_bucket
    url, target = f"s3://{bucket}/out/_writer.lease.json", f"s3://{bucket}/out"
    with FaultProxy(endpoint, slow_every=10**9, drop_every=10**9, strip_conditions=True) as proxy:
        with pytest.raises(StoreRefused) as refused:
            Lease(url, target, "dataset build", proxy.url).acquire()
    message = str(refused.value)
    assert "\n" not in message and f"--endpoint-url {proxy.url}" in message and "ignores conditional writes" in message
    assert store_for(url, endpoint).read() is None


def test_a_holder_whose_clock_runs_behind_is_not_taken_over(where, monkeypatch):
    """Item 6: ages are the store's (its LastModified and Date; a file system's mtimes), not two hosts' wall clocks: a
    live holder whose clock is 30 s behind keeps its lease."""
    url, target, ep = where
    monkeypatch.setenv(STALE_ENV, "6")
    holder = _holder(url, target, ep, prelude="""
        import socket, time
        socket.gethostname = lambda: 'skewed-host'
        _time = time.time
        time.time = lambda: _time() - 30
    """)
    try:
        _held(holder)
        time.sleep(2)
        with pytest.raises(LeaseHeld, match=f"pid {holder.pid} "):
            Lease(url, target, "dataset build", ep).acquire()
        assert holder.poll() is None
    finally:
        holder.kill()


def test_stale_time_from_the_environment(monkeypatch):
    monkeypatch.setenv(STALE_ENV, "7.5")
    assert stale_seconds() == 7.5
    monkeypatch.setenv(STALE_ENV, "soon")
    with pytest.raises(ValueError, match=STALE_ENV):
        stale_seconds()
    monkeypatch.delenv(STALE_ENV)
    assert stale_seconds() == 60.0


def test_lease_beside_a_folder():
    assert lease_url_beside("s3://b/models/bert/") == "s3://b/models/bert.lease.json"
    assert lease_url_beside("/data/runs/r1") == "/data/runs/r1.lease.json"
    with pytest.raises(ValueError, match="not its root"):
        lease_url_beside("s3://bucket")


def test_local_records_are_compare_and_swap(tmp_path):
    """Two writers that read one version: exactly one replaces it; a writer that read a version removed since (it
    stalled through several writes) cannot bring it back."""
    store = store_for(str(tmp_path / "x.lease.json"))
    assert store.create({"write_id": "a"}) and not store.create({"write_id": "b"})
    _, v1 = store.read()
    assert store.replace({"write_id": "c", "prev": "a"}, v1)
    assert not store.replace({"write_id": "d", "prev": "a"}, v1)
    for i in range(5):
        rec, v = store.read()
        assert store.replace({"write_id": f"e{i}", "prev": rec["write_id"]}, v)
    assert not store.replace({"write_id": "stale", "prev": "a"}, v1)  # its successor number was removed as old
    assert store.read()[0]["write_id"] == "e4"


def test_dropped_answers_do_not_cost_the_holder_its_lease(s3_bucket, monkeypatch):
    """Every other answer from the store is cut off mid-way (the PUT was applied, its answer lost). botocore retries
    such a PUT by itself, and the retry's condition (If-None-Match on create, If-Match on a heartbeat) then fails
    against the record the first attempt wrote: the holder must see that record is its own write, keep beating and
    release it at the end, rather than refusing itself or stepping down as if it had been taken over."""
    from _fault_proxy import FaultProxy

    endpoint, bucket = s3_bucket
    url, target = f"s3://{bucket}/out/_writer.lease.json", f"s3://{bucket}/out"
    monkeypatch.setenv(STALE_ENV, "4")  # a heartbeat every second
    steps = Steps()
    with FaultProxy(endpoint, slow_every=10**9, drop_every=2) as proxy:
        with holding(url, target, "dataset build", proxy.url, on_lost=steps) as lease:
            time.sleep(6)
            assert not lease.lost and not steps.messages
            assert record(url, endpoint)["token"] == lease.token
    assert proxy.counts["dropped"] >= 6, proxy.counts
    assert not steps.messages
    assert record(url, endpoint)["token"] is None  # released


def test_every_thread_that_steps_down_waits_for_the_line_saying_why(tmp_path):
    """Two threads find the lease lost at once (a stalled driver woken up: its heartbeat and its watchdog): the one
    line naming the taker is written before either ends the process, however long the handler takes to write it."""
    import threading

    written, ended = [], []

    class Slow(logging.Handler):
        def emit(self, record):
            time.sleep(0.3)  # a redacting formatter on a loaded machine
            written.append(record.getMessage())

    lease = Lease(str(tmp_path / "x.lease.json"), str(tmp_path / "x"), "test run",
                  on_lost=lambda message: ended.append(list(written)))
    handler = Slow(level=logging.ERROR)
    logger = logging.getLogger("storage.lease")
    logger.addHandler(handler)
    try:
        first = threading.Thread(target=lease.lose, args=("taken over by job 2",))
        first.start()
        time.sleep(0.05)
        lease.lose("taken over by job 2")  # the second thread: it must not end the process before the line is out
        first.join()
    finally:
        logger.removeHandler(handler)
    assert written == ["taken over by job 2"]
    assert ended == [["taken over by job 2"], ["taken over by job 2"]], ended


def test_a_process_ended_on_a_lost_lease_leaves_no_scratch_file_in_the_record(tmp_path):
    """A stalled build woken up exits (os._exit) from its lease thread while its main thread reads the store's clock
    (a probe file made and removed): the process ends only after the probe is gone, so no ``.clock-`` or ``.write-``
    file is left in the lease folder beside the taker's records."""
    record = tmp_path / "x.lease.json"
    script = textwrap.dedent(f"""
        import tempfile, threading, time
        from storage import lease_record, lease_store

        store = lease_store.store_for({str(record)!r})
        made = threading.Event()

        def slow_mkstemp(*args, **kwargs):  # a probe made, then the thread descheduled before it is removed
            got = tempfile.mkstemp(*args, **kwargs)
            made.set()
            time.sleep(1.0)
            return got

        lease_store.tempfile = type("T", (), {{"mkstemp": staticmethod(slow_mkstemp)}})
        threading.Thread(target=store.now).start()
        made.wait(10)
        lease_record.exit_process("lost")
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert sorted(os.listdir(record)) == [], sorted(os.listdir(record))
