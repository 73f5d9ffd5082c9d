"""Running one stage: its job as a subprocess (`python -u jobs/<job>.py ARGV`), its output streamed, prefixed, to
the caller and to the stage's log file, its last JSON line returned.

A subprocess per stage gives every stage a fresh Ray driver and MLflow client (no state leaks from one stage's
`ray.init` or active run into the next; a stage that crashes or is OOM-killed cannot take the workflow's
bookkeeping with it), and under `ray job submit` each stage joins the same cluster through the inherited
RAY_ADDRESS. The price is a Ray start per stage on a laptop (seconds).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workflows.stage import JobStage

JOBS_DIR = Path(__file__).resolve().parent.parent / "jobs"
# Ray gives a new local node 30 s (hard-coded) to come up; a loaded machine can miss it. Such a stage failed
# before doing anything and is retried (the jobs are idempotent); any other failure stops the workflow.
RETRYABLE_START_ERRORS = ("The current node timed out during startup",)
RETRIES = 2


class StageFailed(RuntimeError):
    """A stage exited non-zero; the message says where its log is and how to rerun it."""


def _die_with_parent() -> None:
    """Linux: the stage gets SIGTERM if the workflow dies (even by SIGKILL), so no orphan keeps a cluster busy."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def run_job_stage(stage: JobStage, argv: list[str], log_file: Path, echo: Callable[[str], None]) -> dict[str, Any]:
    """Run the job (again, after a transient start-up failure); return its last JSON line."""
    for attempt in range(RETRIES + 1):
        rc, last_json, transient = _run_once(stage, argv, log_file, echo)
        if rc == 0:
            return last_json
        if not transient or attempt == RETRIES:
            break
        echo(f"== {stage.name}: Ray did not start in time (a busy machine?); retrying ({attempt + 1}/{RETRIES})")
    raise StageFailed(f"stage {stage.name} failed (exit {rc}); its full log: {log_file}\n"
                      f"  rerun the workflow to resume, or run the stage alone:\n  {stage.command()}")


def _run_once(stage: JobStage, argv: list[str], log_file: Path,
              echo: Callable[[str], None]) -> tuple[int, dict[str, Any], bool]:
    cmd = [sys.executable, "-u", str(JOBS_DIR / f"{stage.job}.py"), *argv]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    last_json: dict[str, Any] = {}
    transient = False
    with open(log_file, "a", buffering=1) as lf:  # line-buffered: `tail -f` the log while it runs
        lf.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {stage.command()}\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                env=env, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        try:
            for line in proc.stdout:
                lf.write(line)
                echo(f"  {stage.key} | {line.rstrip()}")
                s = line.strip()
                transient = transient or any(t in s for t in RETRYABLE_START_ERRORS)
                if s.startswith("{") and s.endswith("}"):
                    try:
                        last_json = json.loads(s)
                    except json.JSONDecodeError:
                        pass
            rc = proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    return rc, last_json, transient
