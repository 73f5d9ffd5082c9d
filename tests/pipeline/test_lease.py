"""The writer lease (pipeline/safe_io/lease.py) on local disk and on a real S3-protocol server (moto on loopback): one holder
at a time, a one-line refusal naming the holder, release on exit and on error, heartbeats that keep a live holder,
and a holder killed with SIGKILL taken over once its heartbeat is older than the stated time."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import storage
from pipeline.safe_io.lease import STALE_ENV, Lease, LeaseHeld, holding, lease_url_beside, stale_seconds

REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    """(lease URL, target, endpoint URL) on local disk or in a fresh bucket."""
    if request.param == "local":
        yield str(tmp_path / "out" / "_writer.lease.json"), str(tmp_path / "out"), None
    else:
        endpoint, bucket = request.getfixturevalue("s3_bucket")
        yield f"s3://{bucket}/out/_writer.lease.json", f"s3://{bucket}/out", endpoint


def test_one_holder_and_a_one_line_refusal(where):
    url, target, ep = where
    with holding(url, target, "dataset build", ep, hint="or use another --output") as first:
        with pytest.raises(LeaseHeld) as refused:
            Lease(url, target, "dataset build", ep).acquire()
        message = str(refused.value)
        assert "\n" not in message
        assert f"pid {os.getpid()}" in message and "host " in message and "started " in message
        assert message.startswith(f"{target} is being written by another dataset build")
        record = json.loads(storage.read_bytes(url, ep))
        assert record["token"] == first.token  # the refused writer left the record as it was
    assert not storage.exists(url, ep)  # released
    with holding(url, target, "dataset build", ep):  # and free for the next writer
        pass


def test_released_on_error(where):
    url, target, ep = where
    with pytest.raises(RuntimeError, match="boom"):
        with holding(url, target, "pre-training run", ep):
            raise RuntimeError("boom")
    assert not storage.exists(url, ep)


def test_heartbeat_keeps_a_live_holder(where, monkeypatch):
    url, target, ep = where
    # Short enough to pass it several times, long enough that a loaded machine's slow beats never look stale (the
    # holder would then be taken over, and its heartbeat would interrupt this test).
    monkeypatch.setenv(STALE_ENV, "4")
    with holding(url, target, "export", ep):
        time.sleep(10)  # well past the stale time: only the heartbeats keep the record fresh
        with pytest.raises(LeaseHeld, match=r"heartbeat [0-3] s ago"):
            Lease(url, target, "export", ep).acquire()


def test_a_killed_holder_is_taken_over_after_the_stated_time(where, monkeypatch, caplog):
    url, target, ep = where
    monkeypatch.setenv(STALE_ENV, "6")  # the holder inherits it
    code = ("import sys, time; from pipeline.safe_io.lease import Lease; "
            f"Lease({url!r}, {target!r}, 'dataset build', {ep!r}).acquire(); print('held', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        killed_at = time.time()
        with pytest.raises(LeaseHeld, match=f"pid {holder.pid} "):  # its last heartbeat is still recent
            Lease(url, target, "dataset build", ep).acquire()
        time.sleep(max(0.0, killed_at + 6.5 - time.time()))
        with caplog.at_level(logging.WARNING, logger="pipeline.safe_io.lease"):
            with holding(url, target, "dataset build", ep) as taker:
                assert json.loads(storage.read_bytes(url, ep))["token"] == taker.token
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("took over from host" in w and f"pid {holder.pid} " in w for w in warned), warned
    finally:
        if holder.poll() is None:
            holder.kill()


def test_a_taken_over_holder_cannot_renew(where, monkeypatch):
    """A holder that stalled past the stale time finds the record no longer its own: its renewal is refused (S3:
    the If-Match on its own record's etag fails), so it never overwrites the new holder's record."""
    url, target, ep = where
    monkeypatch.setenv(STALE_ENV, "1")
    first = Lease(url, target, "export", ep).acquire()
    first._stop.set()  # a stall: no more heartbeats
    first._thread.join()
    time.sleep(1.5)
    with holding(url, target, "export", ep) as second:
        assert first._read()[0]["token"] == second.token
        if ep is not None:
            assert not first._replace(first._etag)
        first.lost = True  # what its heartbeat would have concluded
        first.release()
        assert json.loads(storage.read_bytes(url, ep))["token"] == second.token


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


def test_dropped_answers_do_not_cost_the_holder_its_lease(s3_bucket, monkeypatch):
    """Every other answer from the store is cut off mid-way (the PUT was applied, its answer lost). botocore retries
    such a PUT by itself, and the retry's condition (If-None-Match on create, If-Match on a heartbeat) then fails
    against the record the first attempt wrote: the holder must see that record is its own, keep beating and
    release it at the end, rather than refusing itself or stopping its job as if it had been taken over."""
    from _fault_proxy import FaultProxy

    endpoint, bucket = s3_bucket
    url, target = f"s3://{bucket}/out/_writer.lease.json", f"s3://{bucket}/out"
    monkeypatch.setenv(STALE_ENV, "2")  # a heartbeat every 0.5 s
    with FaultProxy(endpoint, slow_every=10**9, drop_every=2) as proxy:
        with holding(url, target, "dataset build", proxy.url) as lease:
            time.sleep(6)
            assert not lease.lost
            assert json.loads(storage.read_bytes(url, endpoint))["token"] == lease.token
    assert proxy.counts["dropped"] >= 6, proxy.counts
    assert not lease.lost
    assert not storage.exists(url, endpoint)
