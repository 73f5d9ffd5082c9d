"""The local stack (scripts/local_stack.sh) behaves like a cluster: the README's `ray job submit --working-dir . --
python jobs/build_dataset.py ...` runs against its head, writes a complete dataset, logs to its MLflow server, and
`stop` leaves nothing running.

The stack gets its own state dir, Ray temp dir and free ports, so it cannot meet another Ray on this machine
(a `ray start` head is otherwise discoverable by later `ray.init()` calls) and is always stopped in `finally`.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from _local_stack import free_ports, local_stack

from tracking.store import DEFAULT_EXPERIMENT

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _stack(cmd: str, env: dict) -> subprocess.CompletedProcess:
    return local_stack(cmd, env, timeout=300)


def _env_file(state: Path) -> dict[str, str]:
    """env.sh as a shell that sources it sees it (its PATH line extends the current $PATH)."""
    out = {}
    for line in (state / "env.sh").read_text().splitlines():
        k, v = line.removeprefix("export ").split("=", 1)
        out[k] = v.replace("$PATH", os.environ.get("PATH", ""))
    return out


def _processes_naming(text: str) -> list[str]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                found.append(f"{d.name}: {cmd[:120]}")
    return found


def test_ray_job_submit_to_the_local_stack(tmp_path):
    state = Path(tempfile.mkdtemp(prefix="stack-", dir=tmp_path))
    ray_port, dash_port, mlflow_port = free_ports(3)
    env = dict(os.environ, LOCAL_STACK_DIR=str(state), RAY_PORT=str(ray_port), RAY_DASHBOARD_PORT=str(dash_port),
               MLFLOW_PORT=str(mlflow_port), LOCAL_STACK_CPUS="2", RAY_worker_niceness="0",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")  # `ray`, `mlflow`
    env.pop("RAY_ADDRESS", None)
    out_dir = tmp_path / "dataset"
    try:
        started = _stack("start", env)
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"export MLFLOW_TRACKING_URI=http://127.0.0.1:{mlflow_port}" in started.stdout
        assert _stack("status", env).returncode == 0
        # `status` in another shell, without the start's port variables: the ports the stack runs on.
        bare = {k: v for k, v in env.items() if k not in ("RAY_PORT", "RAY_DASHBOARD_PORT", "MLFLOW_PORT")}
        status = _stack("status", bare)
        assert status.returncode == 0 and f"job server http://127.0.0.1:{dash_port}" in status.stdout, status.stdout
        assert f"GCS 127.0.0.1:{ray_port}" in status.stdout and f"http://127.0.0.1:{mlflow_port}," in status.stdout
        job_env = dict(env, **_env_file(state))
        # The README's command, verbatim apart from absolute paths (a job's working dir is a temporary copy).
        cmd = (f"ray job submit --working-dir . -- python jobs/build_dataset.py "
               f"--input {SAMPLE / 'corpus' / 'mobydick.jsonl.gz'} --output {out_dir} "
               f"--vocab {SAMPLE / 'reference' / 'bert-base-uncased-vocab.txt'} --dupe-factor 1 --num-shards 3")
        job = subprocess.run(shlex.split(cmd), cwd=REPO, env=job_env, capture_output=True, text=True, timeout=600)
        assert job.returncode == 0, job.stdout[-5000:] + job.stderr[-5000:]
        assert "succeeded" in job.stdout + job.stderr
        manifest = json.loads((out_dir / "manifest.json").read_text())
        shards = sorted((out_dir / "shards").glob("*.parquet"))
        assert len(shards) == len(manifest["shards"]) == 3
        rows = [s["rows"] for s in manifest["shards"]]
        assert max(rows) - min(rows) <= 1 and sum(rows) == manifest["totals"]["instances"] > 0
        # The job found the stack's MLflow server through the head's environment, not through ours.
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"http://127.0.0.1:{mlflow_port}")
        exp = client.get_experiment_by_name(DEFAULT_EXPERIMENT)
        runs = client.search_runs([exp.experiment_id])
        assert len(runs) == 1 and runs[0].data.metrics["instances"] == manifest["totals"]["instances"]
    finally:
        stopped = _stack("stop", env)
    assert stopped.returncode == 0, stopped.stderr
    assert _stack("status", env).returncode != 0
    assert _processes_naming(str(state)) == []
    ray_tmp = next(line for line in started.stdout.splitlines() if "temp /tmp/ray-stack-" in line)
    ray_tmp = ray_tmp.split("temp ")[1].rstrip(")")
    assert _processes_naming(ray_tmp) == []

