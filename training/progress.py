"""Where a run is, in an operator's words: `step 300/1000 (30.0%) 2.41 steps/s ETA 4m50s`, plus the --max-minutes
budget when there is one (`budget 10m: 7m55s left, ends near step 1440`), for pre-training's and fine-tuning's log
lines.

The rate counts the steps this process ran since it started training (a resumed run does not count the steps it
inherited; a rolled-back run counts the steps it redid), so the ETA is what the remaining steps will take at the
pace seen so far. The ETA is the sooner of the steps' end and the budget's.
"""
from __future__ import annotations

import time
from collections.abc import Callable


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
    """Percentage, rate and ETA of a loop of `total` steps (optionally under a wall-clock budget)."""

    def __init__(self, total: int, budget_seconds: float | None = None, unit: str = "steps",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.budget, self.unit, self.clock = total, budget_seconds, unit, clock
        self.start, self.done = clock(), 0

    def advance(self, steps: int = 1) -> None:
        self.done += steps

    def describe(self, step: int) -> str:
        elapsed = self.clock() - self.start
        rate = self.done / elapsed if elapsed > 0 and self.done else 0.0
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
        return f"{text} ETA {duration(left)}"
