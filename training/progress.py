"""Where a run is, in an operator's words: `step 300/1000 (30.0%) 2.41 steps/s ETA 4m50s`, plus the --max-minutes
budget when there is one (`budget 10m: 7m55s left, ends near step 1440`), for pre-training's and fine-tuning's log
lines; and, before an afternoon is wasted, how long the run will take.

- After its first steps (ESTIMATE_AFTER steps, or the first minute), the run's estimated length, once; when that is
  an hour or more on CPU, one line of advice (the caller's words: a smaller --preset, --use-gpu).
- A line at least every HEARTBEAT seconds of wall time whatever a step costs: `notes` after a step, and
  `heartbeat`'s thread while a step runs (a bert_base step on 2 CPUs takes minutes). During the first step the
  line states a lower bound of the run's length: the step has taken at least that long.

- On CPU, when the machine is the reason a run is slow (this process got well under its CPUs' time, and more
  processes want the cores than there are), the ETA line and the estimate say so, with the rate this process would
  reach with its CPUs to itself: `machine_note()` (pre-training also tags the run with it, `slowed_by`, so the
  closing summary names the cause).

The rate counts the steps this process ran since it started training (a resumed run does not count the steps it
inherited; a rolled-back run counts the steps it redid), so the ETA is what the remaining steps will take at the
pace seen so far. The ETA is the sooner of the steps' end and the budget's.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator

HEARTBEAT = 60.0  # seconds of wall time without a progress line, at most
ESTIMATE_AFTER = 3  # steps before the run's length is estimated (the first ones carry start-up costs)
HOURS = 3600.0  # an estimate from here on, on CPU, gets the advice
BUSY_SHARE = 0.6  # below this share of its CPUs' time (and with more runnable processes than cores): a busy machine


def duration(seconds: float) -> str:
    """12s, 4m05s, 3h07m, 2d04h."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


class Progress:
    """Percentage, rate and ETA of a loop of `total` steps (optionally under a wall-clock budget). `on_cpu` and
    `slow_advice` ("try a smaller --preset ... or --use-gpu"): what to say when the estimate is hours on CPU."""

    def __init__(self, total: int, budget_seconds: float | None = None, unit: str = "steps",
                 clock: Callable[[], float] = time.monotonic, *, on_cpu: bool = False,
                 slow_advice: str = "", first_step: int = 0, cpus: float | None = None,
                 cpu_clock: Callable[[], float] = time.process_time,
                 load: Callable[[], float] = lambda: os.getloadavg()[0]) -> None:
        self.total, self.budget, self.unit, self.clock = total, budget_seconds, unit, clock
        # CPU seconds of this whole process (torch's threads, the data thread) against `cpus` x wall: how much of
        # its CPUs the run got. None: not measured (a GPU run's CPU time says nothing about its speed).
        self.cpus, self.cpu_clock, self.load = (cpus if on_cpu else None), cpu_clock, load
        self.cpu_start = cpu_clock()
        self.on_cpu, self.slow_advice = on_cpu, slow_advice
        self.start, self.done = clock(), 0
        self.last_line = self.step_started = self.start
        self.step = first_step  # the last step finished (its number in the run, resumed steps included)
        self.estimated = False

    def advance(self, steps: int = 1, step: int | None = None) -> None:
        self.done += steps
        self.step = self.step + steps if step is None else step
        self.step_started = self.clock()

    def rate(self) -> float:
        elapsed = self.clock() - self.start
        return self.done / elapsed if elapsed > 0 and self.done else 0.0

    def cpu_share(self) -> float | None:
        """The share of its CPUs' time this process got since training started (None: not measured yet)."""
        elapsed = self.clock() - self.start
        if not self.cpus or elapsed <= 0 or not self.done:
            return None
        return (self.cpu_clock() - self.cpu_start) / (elapsed * self.cpus)

    def machine_note(self) -> str | None:
        """When the machine's load is why the run is slow: "the machine is busy (load 4.1 on 2 cores): this
        process got 48% of its 2 CPUs, 2.1 steps/s against ~4.4 expected with them to itself; ..."; None otherwise."""
        share, cores = self.cpu_share(), os.cpu_count() or 1
        if share is None or share >= BUSY_SHARE:
            return None
        load = self.load()
        if load <= cores:
            return None
        rate, cpus = self.rate(), f"{self.cpus:g} CPU{'s' if self.cpus != 1 else ''}"
        return (f"the machine is busy (load {load:.1f} on {cores} cores): this process got {100 * share:.0f}% of its "
                f"{cpus}, {rate:.3g} {self.unit}/s against ~{rate / max(share, 0.05):.3g} expected with them to "
                "itself; the same steps, only slower")

    def describe(self, step: int) -> str:
        self.last_line = now = self.clock()
        elapsed = now - self.start
        rate = self.rate()
        text = f"step {step}/{self.total} ({100 * step / self.total:.1f}%)"
        if rate <= 0:
            return text
        text += f" {rate:.3g} {self.unit}/s"
        left = (self.total - step) / rate
        if self.budget:
            budget_left = max(0.0, self.budget - elapsed)
            if budget_left < left:
                return (f"{text} ETA {duration(budget_left)} (the {duration(self.budget)} budget ends first, near "
                        f"step {min(self.total, step + int(rate * budget_left))})")
            return f"{text} ETA {duration(left)} (budget {duration(self.budget)}: {duration(budget_left)} left)"
        note = self.machine_note()
        return f"{text} ETA {duration(left)}" + (f" ({note})" if note else "")

    def _advice(self, seconds: float) -> str:
        if self.on_cpu and seconds >= HOURS and self.slow_advice:
            return f"; that is hours on CPU: {self.slow_advice}"
        return ""

    def estimate(self, step: int) -> str:
        """The run's estimated length from the pace so far (what the budget allows, when it ends first)."""
        rate = self.rate()
        left = (self.total - step) / rate
        total = self.clock() - self.start + left
        text = (f"estimated run length: {duration(total)} for {self.total - step + self.done} {self.unit} at "
                f"{rate:.3g} {self.unit}/s (from the first {self.done})")
        if self.budget and self.budget < total:
            text += (f", but the --max-minutes budget of {duration(self.budget)} stops it near step "
                     f"{min(self.total, step + int(rate * max(0.0, self.budget - (self.clock() - self.start))))}")
            return text + self._advice(total)
        return text + self._advice(total)  # (describe(), logged with it, names a busy machine)

    def notes(self, step: int) -> list[str]:
        """Lines due after step `step`: the estimate (once, after the first steps) and the progress line when none
        was logged for HEARTBEAT seconds. The caller logs them."""
        lines = []
        now = self.clock()
        if not self.estimated and self.done and (self.done >= ESTIMATE_AFTER or now - self.start >= HEARTBEAT):
            self.estimated = True
            lines.append(f"{self.describe(step)}; {self.estimate(step)}")
        elif now - self.last_line >= HEARTBEAT:
            lines.append(self.describe(step))
        return lines

    def waiting(self) -> str | None:
        """The line for a step that has run HEARTBEAT seconds with no line logged (None when one is not due)."""
        now = self.clock()
        if now - self.last_line < HEARTBEAT:
            return None
        self.last_line = now
        running = now - self.step_started
        text = f"step {self.step + 1}/{self.total} has been running for {duration(running)}"
        if self.estimated or self.done >= ESTIMATE_AFTER:
            return f"{text}; {self.describe(self.step)}"
        # No estimate yet: each remaining step takes at least what this one has taken so far.
        floor = running * (self.total - self.step)
        if self.done:
            floor = max(floor, (self.total - self.step) / self.rate())
        return (f"{text} ({self.done} finished so far): the run will take at least {duration(floor)} at this pace"
                + self._advice(floor))

    @contextlib.contextmanager
    def heartbeat(self, log: Callable[[str], None]) -> Iterator[None]:
        """While the block runs, a thread logs `waiting()`'s line whenever one is due (a step slower than a
        minute, a long evaluation): no minute of wall time goes by without a line."""
        stop = threading.Event()
        poll = HEARTBEAT / 12  # 5 s: a line is at most that late

        def beat() -> None:
            while not stop.wait(poll):
                line = self.waiting()
                if line:
                    log(line)

        thread = threading.Thread(target=beat, name="progress-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
