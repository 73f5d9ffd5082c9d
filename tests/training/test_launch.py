"""training.launch: a local Ray started by a job listens on loopback only, whatever the environment; the launch
config refuses what Ray or the run could not do, with the flag to change."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from training.launch import LaunchConfig

REPO = Path(__file__).resolve().parents[2]

# In a fresh interpreter, the worst case: cluster mode asked for in the environment and Ray imported before the
# job starts it. Every listening socket of the driver and of the processes Ray started under it is reported.
SCENARIO = """
import json, os
import ray
import psutil  # Ray ships it
from cluster.ray_start import init_ray

init_ray(num_cpus=1, dashboard=True)

@ray.remote
def pid():
    return os.getpid()

worker = ray.get(pid.remote())
listeners = []
for proc in [psutil.Process()] + psutil.Process().children(recursive=True):
    try:
        listeners += [(proc.name(), c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        pass
node_ip = ray.util.get_node_ip_address()
ray.shutdown()
print(json.dumps({"listeners": listeners, "node_ip": node_ip, "worker": worker}))
"""


@pytest.mark.timeout(300)
def test_local_ray_listens_on_loopback_only():
    with tempfile.TemporaryDirectory(prefix="rl", dir="/tmp") as ray_tmp:  # short: Ray's Unix socket paths
        env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_TMPDIR": ray_tmp,
               "PYTHONPATH": str(REPO)}
        env.pop("RAY_ADDRESS", None)
        out = subprocess.run([sys.executable, "-c", SCENARIO], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["node_ip"] == "127.0.0.1"
    names = {name for name, _, _ in result["listeners"]}
    assert {"gcs_server", "raylet"} <= names, result  # the daemons were seen, so their sockets were checked
    loopback = ("127.0.0.1", "::1", "::ffff:127.0.0.1")
    assert [entry for entry in result["listeners"] if entry[1] not in loopback] == []


@pytest.mark.parametrize("changes, message", [
    ({"num_workers": 0}, "--num-workers"),
    ({"cpus_per_worker": 1.5}, "fraction <= 1 or a whole number"),
    ({"no_ray": True, "num_workers": 2}, "drop --num-workers or --no-ray"),
    ({"no_ray": True, "storage": "s3://bucket/runs"}, "keeps checkpoints on local disk"),
    ({"name": "a/b"}, "--run-name"),
    ({"num_workers": 3, "min_workers": 4}, "MIN:MAX with 1 <= MIN <= MAX"),
    ({"num_workers": 3, "min_workers": 0}, "MIN:MAX with 1 <= MIN <= MAX"),
    ({"no_ray": True, "num_workers": 1, "min_workers": 1, "resize_check_seconds": 0}, "--resize-check-seconds"),
])
def test_launch_config_refuses_what_cannot_run(changes, message):
    with pytest.raises(ValueError, match=message):
        LaunchConfig(**changes)


def test_a_run_in_this_process_keeps_checkpoints_in_a_local_folder(tmp_path):
    launch = LaunchConfig(no_ray=True, storage=f"file://{tmp_path}/runs", name="phase1")
    assert launch.local_directory == tmp_path / "runs" / "phase1"


def test_an_elastic_launch_is_a_range_of_workers():
    elastic = LaunchConfig(num_workers=3, min_workers=1)
    assert elastic.elastic and elastic.fewest_workers == 1
    fixed = LaunchConfig(num_workers=3, min_workers=3)
    assert not fixed.elastic and fixed.fewest_workers == 3 and LaunchConfig(num_workers=2).fewest_workers == 2
