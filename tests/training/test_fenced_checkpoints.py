"""Checkpoints and MLflow points under a job's writer lease (training/checkpoint.py, training/fenced.py,
storage/fence.py), without Ray: a writer proves the lease before each checkpoint and commits it after; a
writer that was taken over can neither write nor commit (one line naming the taker); a resume takes the newest
committed checkpoint whose files are intact, never a newer folder that was not committed or one a stalled job
overwrote; a stalled holder's writers stop proving within half the stale time."""
from __future__ import annotations

import json
import pickle
import time

import pytest

from storage.fence import Fence
from storage.lease import STALE_ENV, Lease
from storage.lease_record import LeaseLost
from tracking.tracker import NullTracker
from training.checkpoint import COMMITS, LocalCheckpoints, checkpoint_name
from training.fenced import FencedTracker


class Steps:
    def __init__(self) -> None:
        self.messages: list[str] = []

    def __call__(self, message: str) -> None:
        self.messages.append(message)


def _writer(seed: int):
    def write(directory) -> None:
        (directory / "train_state.json").write_text(json.dumps({"seed": seed}))
        (directory / "weights.bin").write_bytes(bytes([seed]) * 1000)
    return write


STALE = 4.0  # a beat every second: a loaded machine's slow beats must not look like a stall


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv(STALE_ENV, str(STALE))
    folder = tmp_path / "runs" / "r"
    return folder, str(folder) + ".lease.json"


def _take_over(url: str, target: str, first: Lease) -> Lease:
    """``first`` stalls (its beats stop) past the stale time; another job takes the lease over."""
    first._stop.set()
    for thread in first._threads:
        thread.join()
    time.sleep(STALE + 0.6)
    return Lease(url, target, "pre-training run", on_lost=Steps()).acquire()


def test_a_taken_over_writer_can_neither_write_nor_commit(run):
    folder, url = run
    first = Lease(url, str(folder), "pre-training run", on_lost=Steps()).acquire()
    ours = LocalCheckpoints(folder, keep=3, fence=first.fence)
    ours.save(20, {}, _writer(1))
    taker = _take_over(url, str(folder), first)
    try:
        with pytest.raises(LeaseLost) as lost:
            ours.save(40, {}, _writer(1))
        message = str(lost.value)
        assert "\n" not in message and "lost its writer lease to pre-training run on host" in message
        assert not (folder / checkpoint_name(40)).exists()  # refused before writing
        # A proof taken just before the takeover does not let a commit through: the commit is conditional.
        with pytest.raises(LeaseLost):
            first.fence.commit(COMMITS, {"name": checkpoint_name(60), "step": 60, "digest": "x"})
        entries, _ = taker.fence.committed(COMMITS)
        assert [e["step"] for e in entries] == [20]
        with pytest.raises(LeaseLost):
            FencedTracker(NullTracker(), first.fence).log({"loss": 1.0}, 40)
    finally:
        taker.release()


def test_a_resume_takes_the_newest_committed_intact_checkpoint(run, caplog):
    folder, url = run
    first = Lease(url, str(folder), "pre-training run", on_lost=Steps()).acquire()
    ours = LocalCheckpoints(folder, keep=5, fence=first.fence)
    for step in (20, 40, 60):
        ours.save(step, {}, _writer(1))
    taker = _take_over(url, str(folder), first)
    try:
        # What the stalled job wrote after it lost the lease: a newer folder never committed, and an overwrite of
        # a committed one (its files no longer have the committed digest).
        late = folder / checkpoint_name(80)
        late.mkdir()
        _writer(1)(late)
        (folder / checkpoint_name(60) / "weights.bin").write_bytes(b"\x07" * 1000)
        resumed = LocalCheckpoints(folder, keep=5, fence=taker.fence)
        with resumed.latest() as chosen:
            assert chosen == folder / checkpoint_name(40)
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "not resuming from checkpoint-00000080: written without a commit" in said
        assert "not resuming from checkpoint-00000060: its files differ from what was committed" in said
        # The taker's own checkpoints commit under its lease; the stale folder is left alone.
        resumed.save(60, {}, _writer(2))
        with resumed.latest() as chosen:
            assert chosen == folder / checkpoint_name(60)
        assert json.loads((chosen / "train_state.json").read_text())["seed"] == 2
        assert late.is_dir()
    finally:
        taker.release()


def test_checkpoints_older_than_the_first_record_are_resumed_from(run):
    """A run started by a version of this tool without commits: its folders predate the lease's first record and
    are trusted until the first commit under the lease."""
    folder, url = run
    old = LocalCheckpoints(folder, keep=3)  # no fence: as before
    old.save(20, {}, _writer(1))
    time.sleep(0.05)
    lease = Lease(url, str(folder), "pre-training run", on_lost=Steps()).acquire()
    try:
        with LocalCheckpoints(folder, keep=3, fence=lease.fence).latest() as chosen:
            assert chosen == folder / checkpoint_name(20)
    finally:
        lease.release()


def test_writers_stop_proving_when_the_holder_stops_beating(run):
    """The holder (a job's driver) stalls: its beats stop, nobody has taken over yet. A writer in another process
    (here: a fence unpickled, as a Ray worker gets it) stops proving within half the stale time of the last beat."""
    folder, url = run
    holder = Lease(url, str(folder), "pre-training run", on_lost=Steps()).acquire()
    try:
        fence: Fence = pickle.loads(pickle.dumps(holder.fence))
        fence.check(fresh=True)
        holder._stop.set()
        for thread in holder._threads:
            thread.join()
        stalled = time.monotonic()
        while True:
            try:
                fence.check(fresh=True)
            except LeaseLost as e:
                assert "has not renewed the writer lease" in str(e) and "pid " in str(e)
                break
            assert time.monotonic() - stalled < STALE * 0.5 + 0.5, "the writer kept proving a stalled lease"
            time.sleep(0.05)
    finally:
        holder.lost = True  # its threads are stopped: nothing to release


def test_a_fence_travels_without_its_process_state(run):
    folder, url = run
    lease = Lease(url, str(folder), "pre-training run", on_lost=Steps()).acquire()
    try:
        copy = pickle.loads(pickle.dumps(lease.fence))
        assert (copy.url, copy.token, copy.stale) == (url, lease.token, STALE)
        copy.commit(COMMITS, {"name": "checkpoint-00000001", "step": 1, "digest": "d"})
        assert [e["step"] for e in lease.fence.committed(COMMITS)[0]] == [1]
    finally:
        lease.release()
