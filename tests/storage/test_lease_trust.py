"""Issue 43, items 4, 5 and 7, each written as the attack: a stalled writer's file never lands after a takeover
(storage.fs.open_atomic proves the fence right before the final name appears, locally and on a real S3-protocol
server); BERT_LEASE_STALE_SECONDS=nan/inf/absurd is refused before any lease is taken; a store whose clocks disagree
by more than the stale time does not get a live holder evicted (the taker watches the record's version on its own
monotonic clock)."""
from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest

from storage import fs as storage_fs
from storage import lease_store
from storage.lease import STALE_ENV, Lease, LeaseHeld, LeaseLost, stale_seconds
from storage.lease_store import store_for


class Steps:
    """An ``on_lost`` that records the step-down instead of ending the test process."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def __call__(self, message: str) -> None:
        self.messages.append(message)


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    """(lease URL, target, endpoint URL) on local disk or in a fresh bucket."""
    if request.param == "local":
        yield str(tmp_path / "out" / "_writer.lease.json"), str(tmp_path / "out"), None
    else:
        endpoint, bucket = request.getfixturevalue("s3_bucket")
        yield f"s3://{bucket}/out/_writer.lease.json", f"s3://{bucket}/out", endpoint


def _names(url: str, ep: str | None) -> list[str]:
    return storage_fs.list_names(url, ep)


# ---- item 4: the shard commit proves the fence ------------------------------------------------------------------

def test_a_stalled_writers_file_never_lands_after_a_takeover(where, monkeypatch):
    """A build task (its fence pickled, as Ray ships it) writes a shard; while it is in the middle (stalled), its
    job stops beating and another job takes the output over. The task's commit must fail and leave no file under
    the final name (before: the shard landed in OUTPUT/shards/ after the takeover)."""
    url, target, ep = where
    monkeypatch.setenv(STALE_ENV, "2" if ep is None else "4")  # S3's dates are to the second: a proof needs S/2 > 1 s
    first = Lease(url, target, "dataset build", ep, on_lost=Steps()).acquire()
    fence = pickle.loads(pickle.dumps(first.fence))  # what a Ray Data task holds
    shards = storage_fs.join(target, "shards")
    final = storage_fs.join(shards, "part-00000-of-00001.parquet")
    with pytest.raises(LeaseLost, match="lost its writer lease"):
        with storage_fs.open_atomic(final, ep, fence=fence) as f:
            f.write(b"PAR1 a shard from the stalled build PAR1")
            first._stop.set()  # the first job stalls (no beats) ...
            taker = None
            deadline = time.monotonic() + 60
            while taker is None:  # ... until the second one may take over
                try:
                    taker = Lease(url, target, "dataset build", ep, on_lost=Steps()).acquire()
                except LeaseHeld:
                    assert time.monotonic() < deadline, "the stalled lease was never taken over"
                    time.sleep(0.5)
    try:
        assert not storage_fs.exists(final, ep)
        assert [n for n in _names(shards, ep) if storage_fs.TEMP_MARK in n] == []  # its temporary gone too
        # the taker's own commit, proved with its fence, lands
        with storage_fs.open_atomic(final, ep, fence=taker.fence) as f:
            f.write(b"PAR1 the taker's shard PAR1")
        assert storage_fs.read_bytes(final, ep) == b"PAR1 the taker's shard PAR1"
        assert _names(shards, ep) == ["part-00000-of-00001.parquet"]
    finally:
        taker.release()


def test_a_failed_block_leaves_nothing_and_a_killed_writers_temporary_is_cleaned(where, monkeypatch):
    url, target, ep = where
    monkeypatch.setenv(STALE_ENV, "4")
    lease = Lease(url, target, "dataset build", ep, on_lost=Steps()).acquire()
    shards = storage_fs.join(target, "shards")
    try:
        with pytest.raises(RuntimeError):
            with storage_fs.open_atomic(storage_fs.join(shards, "a.parquet"), ep, fence=lease.fence) as f:
                f.write(b"half")
                raise RuntimeError("the task failed")
        assert not storage_fs.exists(storage_fs.join(shards, "a.parquet"), ep)
        leftover = storage_fs.join(shards, "b.parquet" + storage_fs.TEMP_MARK + "0" * 32)  # a killed writer's
        storage_fs.write_bytes_atomic(leftover, b"x", ep)
        storage_fs.remove_stale_temps(shards, ep)
        assert [n for n in _names(shards, ep) if storage_fs.TEMP_MARK in n] == []
    finally:
        lease.release()


# ---- item 5: the stale time is validated ----------------------------------------------------------------------

@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "0", "-5", "0.01", "1e9", "soon"])
def test_a_stale_time_that_is_not_a_sane_number_is_refused_before_any_lease(raw, monkeypatch, tmp_path):
    """Before: nan was taken (the heartbeat spun: thousands of record versions in seconds, every time limit off),
    inf killed the heartbeat thread with a traceback."""
    monkeypatch.setenv(STALE_ENV, raw)
    with pytest.raises(ValueError, match=f"^{STALE_ENV}="):
        stale_seconds()
    url = str(tmp_path / "out" / "_writer.lease.json")
    with pytest.raises(ValueError, match=f"^{STALE_ENV}="):
        Lease(url, str(tmp_path / "out"), "dataset build").acquire()
    assert not (tmp_path / "out").exists()


def test_a_sane_stale_time_is_taken(monkeypatch):
    for raw, value in (("1", 1.0), ("7.5", 7.5), ("86400", 86400.0)):
        monkeypatch.setenv(STALE_ENV, raw)
        assert stale_seconds() == value


def test_a_records_nan_stale_time_does_not_make_its_holder_immortal(tmp_path, monkeypatch):
    monkeypatch.setenv(STALE_ENV, "3")
    lease = Lease(str(tmp_path / "l.json"), str(tmp_path / "out"), "dataset build")
    assert lease._stale_for({"stale_seconds": float("nan")}) == 3.0
    assert lease._stale_for({"stale_seconds": float("inf")}) == 3.0
    assert lease._stale_for({"stale_seconds": 1e12}) == 24 * 3600.0


# ---- item 7: a takeover is measured on the taker's clock --------------------------------------------------------

def test_a_store_whose_clocks_disagree_does_not_evict_a_live_holder(tmp_path, monkeypatch):
    """The store's node that answers the taker's reads runs 1,000 s ahead of the one that dates the holder's beats
    (or a holder's record simply looks old by the store's dates): by the dates alone the live holder is stale.
    Before: taken over at once, and both jobs died. Now the taker watches the record's version for the stale time
    of its own clock, sees the holder beat, and is refused."""
    monkeypatch.setenv(STALE_ENV, "2")
    url, target = str(tmp_path / "out" / "_writer.lease.json"), str(tmp_path / "out")
    steps = Steps()
    holder = Lease(url, target, "dataset build", on_lost=steps).acquire()
    real_now = lease_store._LocalStore.now
    monkeypatch.setattr(lease_store._LocalStore, "now", lambda self: real_now(self) + 1000.0)
    try:
        with pytest.raises(LeaseHeld, match="dataset build"):
            Lease(url, target, "dataset build", on_lost=Steps()).acquire()
        got = store_for(url, None).read()
        assert got is not None and got[0]["token"] == holder.token and steps.messages == []
    finally:
        holder.release()


def test_a_holder_silent_on_the_takers_clock_is_taken_over(tmp_path, monkeypatch):
    """The same skewed store, the holder now stopped: its record stays unchanged for the stale time of the taker's
    clock, which then takes over."""
    monkeypatch.setenv(STALE_ENV, "2")
    url, target = str(tmp_path / "out" / "_writer.lease.json"), str(tmp_path / "out")
    holder = Lease(url, target, "dataset build", on_lost=Steps()).acquire()
    holder._stop.set()  # no more beats
    real_now = lease_store._LocalStore.now
    monkeypatch.setattr(lease_store._LocalStore, "now", lambda self: real_now(self) + 1000.0)
    began = time.monotonic()
    taker = Lease(url, target, "dataset build", on_lost=Steps()).acquire()
    try:
        assert time.monotonic() - began >= 2.0  # it watched for the stale time before taking over
        assert store_for(url, None).read()[0]["token"] == taker.token
    finally:
        taker.release()


# ---- item 4: a build task watches the fence while it runs ---------------------------------------------------------

_TASK = """
import pickle, sys, time
from pipeline.ray_data.guard import in_worker

class Ctx:
    def __init__(self, fence):
        self.fence = fence

class SlowStep:  # a build step as Ray Data runs it: its ctx carries the output's fence
    def __init__(self, fence):
        self.ctx = Ctx(fence)
    def __call__(self, item):
        print("started", flush=True)
        for _ in range(600):  # a minute of work, never committing
            time.sleep(0.1)
        return "finished"

fence = pickle.loads(bytes.fromhex(sys.argv[1]))
print(in_worker(SlowStep(fence), "unit-0"), flush=True)
"""


def test_a_build_task_stops_when_its_jobs_lease_is_lost(tmp_path, monkeypatch):
    """Before: a Ray Data task ran no fence watcher, so a task of a job that had lost its output ran on (and wrote
    its _work files) until it committed. Now the task's process ends, status 2, with one line, soon after the loss."""
    import subprocess
    import sys

    monkeypatch.setenv(STALE_ENV, "2")
    url, target = str(tmp_path / "out" / "_writer.lease.json"), str(tmp_path / "out")
    first = Lease(url, target, "dataset build", on_lost=Steps()).acquire()
    task = subprocess.Popen([sys.executable, "-c", _TASK, pickle.dumps(first.fence).hex()], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(Path(__file__).resolve().parents[2]))
    try:
        assert task.stdout.readline().strip() == "started"
        first._stop.set()  # the job stalls; another takes its output over
        taker = None
        deadline = time.monotonic() + 60
        while taker is None:
            try:
                taker = Lease(url, target, "dataset build", on_lost=Steps()).acquire()
            except LeaseHeld:
                assert time.monotonic() < deadline
                time.sleep(0.5)
        out, err = task.communicate(timeout=50)
        taker.release()
    finally:
        if task.poll() is None:
            task.kill()
    assert task.returncode == 2, err
    assert "finished" not in out
    assert "lost its writer lease" in err or "has not renewed the writer lease" in err, err
