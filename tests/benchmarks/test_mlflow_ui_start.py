"""benchmarks/mlflow_ui_start.py in a small form: it times the command the jobs print on a real store and finds the
page that opens in the model-training view (the full run also times `mlflow ui`: docs/mlflow.md)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.timeout(300)]


def test_it_times_the_printed_command_on_a_store(tmp_path):
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(store).create_experiment("bert")
    done = subprocess.run([sys.executable, "benchmarks/mlflow_ui_start.py", "--store", store, "--only-ours"],
                          cwd=REPO, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = [line for line in done.stdout.splitlines() if line.startswith("| `python jobs/mlflow_ui.py")]
    index, api, view = [c.strip() for c in row.split("|")[2:5]]
    assert 0 < float(index) <= float(api) and view == "yes"
