"""benchmarks/build_driver_scale.py in a small form: a planned build of sparse units answered by replayed markers
runs through the real driver, and its report says the driver listed no folder more often for more units and read
no marker back (the 250,000-unit run is in docs/benchmarks.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_driver_at_more_units_lists_the_same_and_reads_no_marker():
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "build_driver_scale.py"), "--units", "10,1200",
                        "--template-bytes", "100000"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    sizes = [line for line in lines if " units (" in line and "driver" in line]
    assert len(sizes) == 2 and sizes[1].lstrip().startswith("1,200 units (2 files"), p.stdout
    verdict = lines[-1]
    assert "LIST calls at 1,200 units the same as at 10: yes" in verdict, p.stdout
    assert verdict.endswith("marker GETs by the driver: 0"), p.stdout


def test_ray_datas_own_driver_cost_per_task_is_reported():
    """The ``--ray-tasks`` part: trivial tasks through a local Ray's Data, the driver's CPU per task."""
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "build_driver_scale.py"), "--ray-one", "40"],
                       capture_output=True, text=True, cwd=REPO, timeout=600,
                       env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["tasks"] == [4, 40] and len(r["driver_cpu_s"]) == 2 and "driver_ms_per_task" in r, r
