"""A job's local Ray runs its workers at the job's priority: Ray's default niceness 15 starved them beside any
ordinary process (the quickstart's training got ~4% of its CPUs next to two busy loops)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, ray
from cluster.ray_start import init_ray
init_ray(num_cpus=1)

@ray.remote(num_cpus=1)
def niceness():
    return os.nice(0)

print("NICE", os.nice(0), ray.get(niceness.remote()))
ray.shutdown()
"""


def test_a_local_rays_workers_run_at_the_jobs_niceness():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_worker_niceness")}
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("NICE"))
    _, driver, worker = line.split()
    assert worker == driver, f"a Ray worker runs at niceness {worker}, its job at {driver}"
