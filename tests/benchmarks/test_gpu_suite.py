"""The one-command GPU suite (benchmarks/gpu_suite.py) runs every part end to end as a dry run on the CPU: the real
data builds, the fused kernels' self-check under Triton's interpreter, benchmarks/gpu_step.py's variants (kernels
on, off, bf16 residual, transformers beside; seq 512 padded and packed), the real pre-training job fresh and then
resumed from its checkpoint, and `pytest -m gpu`; then its summary table. On a GPU the same parts run at training
shapes; only the shapes and the device differ.

Slow here (~1.5 CPU-minutes of subprocesses, two at a time): one test for the whole suite."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def test_dry_run_runs_every_part_and_prints_the_table(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/gpu_suite.py", "--dry-run", "--work", str(tmp_path / "w")],
                          cwd=REPO, capture_output=True, text=True, timeout=880)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    table = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| part")}
    assert list(table) == ["data", "kernels", "step_on", "step_off", "step_bf16", "seq512_padded", "seq512_packed",
                           "job_fresh", "job_resumed", "pytest_gpu"]
    assert all(status == "ok" for status, _, _ in table.values()), table
    assert table["kernels"][2].count(" ok") == 2 and "FAILED" not in table["kernels"][2]  # LayerNorm, GELU
    assert "bert_core " in table["step_on"][2] and "transformers " in table["step_on"][2]
    for part in ("job_fresh", "job_resumed"):
        assert table[part][2].startswith("first step ") and "data_wait_fraction" in table[part][2], table[part]
    resumed = (tmp_path / "w" / "job_resumed.log").read_text()
    assert "resumed from" in resumed and "at step 2" in resumed  # the fresh run's checkpoint
    assert "skipped" in table["pytest_gpu"][2]  # collected and skipped: no GPU here
