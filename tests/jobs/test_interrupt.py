"""Ctrl-C and SIGTERM sent to a real pre-training job (a subprocess, as an operator's terminal or `ray job stop`
sends them): the first stops the run at the next step boundary after a whole checkpoint, ends its MLflow run KILLED
(read back with MlflowClient), prints one line saying how to resume, and exits 130 (SIGINT) or 143 (SIGTERM) with no
traceback; the same command again resumes from that step. A second signal exits at once."""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)


class Job:
    """`python jobs/pretrain.py ...` in a subprocess whose merged output is read line by line as it comes."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self._start([sys.executable, str(REPO / "jobs" / "pretrain.py"), *args], cwd, env)

    def _start(self, command: list[str], cwd: Path, env: dict[str, str]) -> Job:
        self.proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            self._q.put(line)
        self._q.put(None)

    def wait_for(self, pattern: str, timeout: float = 400) -> re.Match:
        while True:
            line = self._q.get(timeout=timeout)
            assert line is not None, "".join(self.lines)[-4000:]
            m = re.search(pattern, line)
            if m:
                return m

    def finish(self, timeout: float = 300) -> tuple[int, str]:
        """Exit status and the whole output (`timeout`: a hung job fails the test, not a time measured)."""
        rc = self.proc.wait(timeout)
        self._reader.join(30)  # every line read
        return rc, "".join(self.lines)


def env_for(ray_tmpdir: str) -> dict[str, str]:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_TMPDIR": ray_tmpdir, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    return env


def flags(data: dict, tmp: Path, steps: int, *extra: str) -> list[str]:
    # Checkpoints far apart: the stop writes its own, at the step it stops on.
    return ["--data", data["train"], "--preset", "bert_tiny", "--max-steps", str(steps), "--batch-size", "8",
            "--checkpoint-every", "1000", "--log-every", "1", "--storage", str(tmp / "runs"), "--run-name", "stopped",
            "--mlflow-tracking-uri", f"sqlite:///{tmp}/mlflow.db", "--experiment", "t", "--no-system-metrics",
            "--cpus-per-worker", "1", *extra]


def the_run(tmp: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


def interrupted(data: dict, tmp: Path, env: dict, sig: int, *extra: str) -> tuple[int, str, int]:
    job = Job(flags(data, tmp, 5000, *extra), tmp, env)
    step = int(job.wait_for(r"step (\d+)/5000").group(1))
    job.proc.send_signal(sig)
    rc, out = job.finish()
    return rc, out, step


def check_stopped(rc: int, out: str, sig: int, step: int, tmp: Path) -> int:
    name = signal.Signals(sig).name
    assert rc == 128 + sig, out[-4000:]
    assert "Traceback" not in out, out[-6000:]
    stopped = re.search(rf"step (\d+): stopped by {name}; finishing here after a checkpoint", out)
    assert stopped, out[-4000:]
    at = int(stopped.group(1))
    # The step running when the request arrived finishes, and none after it: the last step trained is the one the
    # run stopped at (and checkpointed).
    trained = [int(n) for n in re.findall(r"step (\d+)/5000", out)]
    assert step <= at and max(trained) == at, (step, at, max(trained))
    resume = [line for line in out.splitlines() if "To resume, run the same command again" in line]
    assert len(resume) == 1 and f"checkpoint-{at:08d}" in resume[0], out[-3000:]
    run = the_run(tmp)
    assert run.info.status == "KILLED"
    assert run.data.tags["stopped_by"] == f"{name} at step {at} of 5000"
    assert (tmp / "runs" / "stopped" / f"checkpoint-{at:08d}").is_dir() or any(
        p.name == f"checkpoint-{at:08d}" for p in (tmp / "runs" / "stopped").iterdir())
    return at


def resumed(data: dict, tmp: Path, env: dict, at: int, *extra: str) -> None:
    job = Job(flags(data, tmp, at + 2, *extra), tmp, env)
    rc, out = job.finish(timeout=400)
    assert rc == 0, out[-4000:]
    assert re.search(rf"resumed from .* at step {at}\b", out), out[-4000:]
    run = the_run(tmp)  # the same MLflow run, now finished
    assert run.info.status == "FINISHED" and run.data.tags["resumed_from_step"] == str(at)


def test_sigterm_stops_pretraining_in_process_after_a_checkpoint_and_a_rerun_resumes(tiny_pretrain_data, ray_tmpdir,
                                                                                      tmp_path):
    env = env_for(ray_tmpdir)
    rc, out, step = interrupted(tiny_pretrain_data, tmp_path, env, signal.SIGTERM, "--no-ray")
    at = check_stopped(rc, out, signal.SIGTERM, step, tmp_path)
    resumed(tiny_pretrain_data, tmp_path, env, at, "--no-ray")


def test_a_second_sigint_exits_at_once(tiny_pretrain_data, ray_tmpdir, tmp_path):
    job = Job(flags(tiny_pretrain_data, tmp_path, 5000, "--no-ray"), tmp_path, env_for(ray_tmpdir))
    job.wait_for(r"step (\d+)/5000")
    job.proc.send_signal(signal.SIGINT)
    job.wait_for(r"stopping after the current step")
    job.proc.send_signal(signal.SIGINT)
    rc, out = job.finish()
    assert rc == 130 and "Traceback" not in out, out[-4000:]
    assert "SIGINT again: exiting now" in out


@pytest.mark.slow
def test_sigint_stops_ray_pretraining_after_a_checkpoint_and_a_rerun_resumes(tiny_pretrain_data, ray_tmpdir,
                                                                             tmp_path):
    env = env_for(ray_tmpdir)
    rc, out, step = interrupted(tiny_pretrain_data, tmp_path, env, signal.SIGINT)
    at = check_stopped(rc, out, signal.SIGINT, step, tmp_path)
    assert not (tmp_path / "runs" / "stopped.stop").exists()  # the marker that told the workers is gone
    resumed(tiny_pretrain_data, tmp_path, env, at)


def build(tmp: Path, sample_dir: Path, env: dict) -> Job:
    return Job.__new__(Job)._start([sys.executable, str(REPO / "jobs" / "build_dataset.py"),
                                    "--input", str(sample_dir / "corpus" / "mobydick.jsonl.gz"),
                                    "--output", str(tmp / "out"), "--dupe-factor", "1", "--num-cpus", "2",
                                    "--vocab", str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"),
                                    "--progress", "lines", "--mlflow-tracking-uri", f"sqlite:///{tmp}/mlflow.db",
                                    "--experiment", "t"], tmp, env)


@pytest.mark.slow
def test_sigint_stops_a_ray_build_and_a_rerun_completes(sample_dir, ray_tmpdir, tmp_path):
    env = env_for(ray_tmpdir)
    job = build(tmp_path, sample_dir, env)
    job.wait_for(r"units to run")  # Ray is up and its tasks are running
    job.proc.send_signal(signal.SIGINT)
    rc, out = job.finish()
    assert rc == 130, out[-4000:]
    assert "Traceback" not in out, out[-6000:]
    assert len([line for line in out.splitlines() if "To resume, run the same command again" in line]) == 1
    assert the_run(tmp_path).info.status == "KILLED"
    rc, out = build(tmp_path, sample_dir, env).finish(timeout=600)
    assert rc == 0, out[-4000:]
    assert (tmp_path / "out" / "manifest.json").is_file()
