"""MLflow points under a job's writer lease: a tracker that proves the lease (storage/fence.py) before it
writes into the job's run, so that a worker whose job was taken over never logs a point into the run its taker now
owns. A proof is reused for an eighth of the stale time: at most one read of the lease's record per log window."""
from __future__ import annotations

from tracking.tracker import Tracker


class FencedTracker:
    """`tracker`, each write preceded by `fence.check()` (LeaseLost when the lease cannot be proved)."""

    def __init__(self, tracker: Tracker, fence) -> None:
        self.tracker, self.fence = tracker, fence
        self.history = getattr(tracker, "history", None)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.fence.check()
        self.tracker.log(metrics, step)

    def rewind(self, step: int) -> None:
        self.tracker.rewind(step)

    def set_tag(self, key: str, value: str) -> None:
        self.fence.check()
        self.tracker.set_tag(key, value)

    def close(self) -> None:
        self.fence.check()  # closing flushes system metrics into the run: not into a run that is no longer ours
        self.tracker.close()
