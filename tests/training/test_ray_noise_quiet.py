"""Quiet Ray (issue 44, item 6): Ray Train's own "safe to ignore" warnings and the GetTimeoutError tracebacks under
them are dropped from what the driver prints of its workers' lines (the real lines around them kept; Ray's session
log files keep everything); a local Ray that cannot start is one line keeping Ray's words (the workflow retries on
them)."""
from __future__ import annotations

import types

from jobs._common import RAY_START_TIMEOUT, ray_start_failed
from training.ray_noise import quiet_driver

WARNING = ("Failed to get reserved resources for TrainController_1. Will not resize the worker group. If this only "
           "happens transiently during network partition or CPU being overloaded, it's safe to ignore this error. "
           "If this error persists, file a GitHub issue.")
TRACEBACK = ["Traceback (most recent call last):",
             '  File "/ray/train/v2/_internal/execution/scaling_policy/elastic.py", line 268, in _get_reserved',
             "    reserved_resources = ray.get(",
             "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready."]


def test_the_driver_prints_no_safe_to_ignore_traceback_and_keeps_the_rest():
    printed: list[list[str]] = []
    ray_worker = types.SimpleNamespace(print_worker_logs=lambda data, f, ignore_prefix=False:
                                       printed.append(data["lines"]))
    quiet_driver(ray_worker)
    quiet_driver(ray_worker)  # idempotent: one wrapper
    pid = {"pid": 7, "is_err": True}
    ray_worker.print_worker_logs({**pid, "lines": ["step 3/10 loss=2.1", WARNING, *TRACEBACK[:2]]}, None)
    ray_worker.print_worker_logs({**pid, "lines": [*TRACEBACK[2:], "step 4/10"]}, None)
    ray_worker.print_worker_logs({**pid, "lines": [WARNING]}, None)  # nothing left: nothing printed
    assert printed == [["step 3/10 loss=2.1"], ["step 4/10"]]


def test_a_real_traceback_is_kept():
    printed: list[list[str]] = []
    ray_worker = types.SimpleNamespace(print_worker_logs=lambda data, f, ignore_prefix=False:
                                       printed.append(data["lines"]))
    quiet_driver(ray_worker)
    ray_worker.print_worker_logs({"pid": 1, "is_err": True, "lines": TRACEBACK}, None)
    assert printed == [TRACEBACK]


def test_a_ray_that_cannot_start_is_one_line_with_rays_words():
    error = Exception(f"{RAY_START_TIMEOUT}. This could happen because some of the raylet failed to startup or "
                      "the GCS has become overloaded.")
    line = ray_start_failed(error)
    assert line is not None and "\n" not in line and RAY_START_TIMEOUT in line and "cores" in line
    assert ray_start_failed(ValueError("--lr must be > 0")) is None
