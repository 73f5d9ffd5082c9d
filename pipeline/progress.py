"""Progress a person can watch: one line per stage every few seconds (items done/total, MB/s, ETA), as log lines.

In a terminal the Ray Data executor shows Ray Data's own progress bars instead (``Executor.bars``); in ``ray job
logs``, a redirected output or the plain loop, these lines are what a person sees. A stage that runs longer than
its first line never goes a minute without one, even when no item finishes in between (a heartbeat thread).

Every duration says what it measures: ``s wall`` is elapsed time; ``driver CPU-s`` is the CPU time of this process
only (the workers' CPU is not in it: the driver plans and collects markers, so it stays small and flat).

    read: 12/40 units, 48.0/160.0 MB of text, 6.1 MB/s, ETA 18 s (14.2 s wall)
"""
from __future__ import annotations

import contextlib
import logging
import resource
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# Seconds between two lines: often at first (a person checking that it started), then calmer for long stages,
# always under a minute.
FIRST_INTERVAL_S = 5.0
LATER_INTERVAL_S = 30.0
CALM_AFTER_S = 120.0


def driver_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


def _duration(s: float) -> str:
    if s < 100:
        return f"{s:.0f} s"
    if s < 6000:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


class StageProgress:
    """Counts one stage's items and bytes as they finish; logs a line every few seconds while ``lines`` is on.

    ``total_bytes`` is 0 when the stage's items have no meaningful size (then no MB/s, the ETA from items)."""

    def __init__(self, name: str, noun: str, total: int, total_bytes: int, lines: bool = True,
                 first_interval: float = FIRST_INTERVAL_S, probe: Callable[[], float | None] | None = None):
        self.name, self.noun, self.total, self.total_bytes = name, noun, total, total_bytes
        self.probe = probe  # the share of an unfinished stage's bytes done, from its running item
        self.done = self.done_bytes = 0
        self.t0 = time.perf_counter()
        self.cpu0 = driver_cpu_s()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._first = first_interval
        self._thread = None
        if lines and total:
            self._thread = threading.Thread(target=self._beat, name=f"progress-{name}", daemon=True)
            self._thread.start()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.done += 1
            self.done_bytes += nbytes

    def line(self) -> str:
        with self._lock:
            done, done_bytes = self.done, self.done_bytes
        if self.probe is not None and done < self.total:
            with contextlib.suppress(Exception):  # a progress line is never worth failing a stage for
                done_bytes = max(done_bytes, int((self.probe() or 0) * self.total_bytes))
        wall = time.perf_counter() - self.t0
        parts = [f"{self.name}: {done}/{self.total} {self.noun}"]
        if self.total_bytes:
            parts.append(f"{_mb(done_bytes)}/{_mb(self.total_bytes)} MB of text")
            if done_bytes:
                parts.append(f"{done_bytes / 1e6 / wall:.1f} MB/s")
        left = (self.total_bytes - done_bytes) / done_bytes if self.total_bytes and done_bytes else (
            (self.total - done) / done if done else None)
        parts.append("ETA " + (_duration(left * wall) if left is not None else "--"))
        return ", ".join(parts) + f" ({wall:.1f} s wall)"

    def _beat(self) -> None:
        interval = self._first
        while not self._stop.wait(interval):
            log.info("%s", self.line())
            if time.perf_counter() - self.t0 > CALM_AFTER_S:
                interval = LATER_INTERVAL_S

    def finish(self) -> str:
        """Stop the heartbeat; the stage's summary line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        wall = time.perf_counter() - self.t0
        rate = f", {self.done_bytes / 1e6 / wall:.1f} MB/s" if self.total_bytes and wall > 0 else ""
        size = f" ({_mb(self.done_bytes)} MB of text)" if self.total_bytes else ""
        return (f"{self.name}: {self.done} {self.noun}{size} done in {wall:.1f} s wall{rate}; driver CPU "
                f"{driver_cpu_s() - self.cpu0:.2f} s this stage, {driver_cpu_s():.1f} s since the driver started")
