"""Progress lines and the estimate before a wasted afternoon: a fake clock for the exact lines, and a slow step
stand-in (a step that sleeps past the heartbeat) for the thread that speaks while a step runs."""
from __future__ import annotations

import time

import pytest

from training import progress as progress_mod
from training.progress import HEARTBEAT, Progress, duration


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


ADVICE = "try a smaller --preset (bert_tiny, bert_mini) or --use-gpu"


def test_describe_with_rate_eta_and_budget():
    clock = Clock()
    p = Progress(1000, budget_seconds=600, clock=clock)
    clock.now = 100.0
    p.advance(300, step=300)
    assert p.describe(300) == "step 300/1000 (30.0%) 3 steps/s ETA 3m53s (budget 10m00s: 8m20s left)"


def test_the_estimate_comes_once_after_the_first_steps_with_advice_when_hours_on_cpu():
    clock = Clock()
    p = Progress(1000, clock=clock, on_cpu=True, slow_advice=ADVICE)
    for step in (1, 2):
        clock.now += 20.0
        p.advance(step=step)
        assert p.notes(step) == []  # too early to estimate, and a line 40 s ago is recent enough
    clock.now += 20.0
    p.advance(step=3)
    (line,) = p.notes(3)
    assert line == ("step 3/1000 (0.3%) 0.05 steps/s ETA 5h32m; estimated run length: 5h33m for 1000 steps at "
                    f"0.05 steps/s (from the first 3); that is hours on CPU: {ADVICE}")
    clock.now += 20.0
    p.advance(step=4)
    assert p.notes(4) == []  # the estimate was a line 20 s ago
    clock.now += HEARTBEAT
    p.advance(step=5)
    (line,) = p.notes(5)  # a minute without a line: the progress line, and no second estimate
    assert line.startswith("step 5/1000 (0.5%)") and "estimated" not in line


def test_a_short_run_gets_its_estimate_without_advice_and_a_budget_says_where_it_stops():
    clock = Clock()
    p = Progress(1500, budget_seconds=180, clock=clock, on_cpu=True, slow_advice=ADVICE)
    clock.now = 3.0
    p.advance(3, step=3)
    (line,) = p.notes(3)
    assert line.endswith("estimated run length: 25m00s for 1500 steps at 1 steps/s (from the first 3), but the "
                         "--max-minutes budget of 3m00s stops it near step 180")
    assert "hours on CPU" not in line  # 25 minutes: no advice


def test_no_advice_on_a_gpu():
    clock = Clock()
    p = Progress(100_000, clock=clock, on_cpu=False, slow_advice=ADVICE)
    clock.now = 30.0
    p.advance(3, step=3)
    assert "hours on CPU" not in p.notes(3)[0]


def test_a_first_step_longer_than_a_minute_states_a_lower_bound_and_the_advice():
    clock = Clock()
    p = Progress(1000, clock=clock, on_cpu=True, slow_advice=ADVICE)
    clock.now = HEARTBEAT - 1
    assert p.waiting() is None
    clock.now = HEARTBEAT + 5  # bert_base's first step on 2 CPUs: minutes
    assert p.waiting() == (f"step 1/1000 has been running for 1m05s (0 finished so far): the run will take at least "
                           f"18h03m at this pace; that is hours on CPU: {ADVICE}")
    assert p.waiting() is None  # said; the next one a minute later


def test_the_heartbeat_speaks_during_a_slow_step(monkeypatch):
    """A stand-in for a bert_base step on CPU: each step sleeps well past the (shortened) heartbeat."""
    monkeypatch.setattr(progress_mod, "HEARTBEAT", 0.2)
    monkeypatch.setattr(progress_mod, "HOURS", 60.0)  # the scale shrunk with the step: "hours" is a minute here
    lines: list[str] = []
    p = Progress(500, on_cpu=True, slow_advice=ADVICE)
    with p.heartbeat(lines.append):
        for step in (1, 2):
            time.sleep(0.5)  # the slow step
            p.advance(step=step)
            lines.extend(p.notes(step))
    assert any(line.startswith("step 1/500 has been running for") and "at least" in line and ADVICE in line
               for line in lines), lines
    assert any(line.startswith("step 2/500 has been running for") for line in lines), lines


@pytest.mark.parametrize("seconds, text", [(12, "12s"), (245, "4m05s"), (11220, "3h07m"), (187200, "2d04h")])
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_a_busy_machine_is_named_with_the_rate_expected_idle(monkeypatch):
    clock, cpu = Clock(), Clock()
    monkeypatch.setattr(progress_mod.os, "cpu_count", lambda: 2)
    p = Progress(1000, clock=clock, on_cpu=True, cpus=2, cpu_clock=cpu, load=lambda: 6.2)
    clock.now, cpu.now = 100.0, 60.0  # 60 CPU-seconds in 100 s on 2 CPUs: 30% of its CPUs
    p.advance(200, step=200)
    assert p.describe(200) == ("step 200/1000 (20.0%) 2 steps/s ETA 6m40s (the machine is busy (load 6.2 on 2 "
                               "cores): this process got 30% of its 2 CPUs, 2 steps/s against ~6.67 expected with "
                               "them to itself; the same steps, only slower)")
    quiet = Progress(1000, clock=clock, on_cpu=True, cpus=2, cpu_clock=cpu, load=lambda: 1.5)  # load below cores
    clock.now, cpu.now = 200.0, 90.0
    quiet.advance(200, step=200)
    assert quiet.machine_note() is None
