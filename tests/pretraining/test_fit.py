"""`pretraining.loop.fit` without Ray on real shards (CPU, bert_tiny): it learns, checkpoints, and a second fit resumes
from the kept checkpoint on exactly the batch sequence of the first (same losses step for step).

The scenario runs in a fresh interpreter (fit_scenario.py) so that the absence of Ray and MLflow is a fact about
sys.modules, not about what other tests happened to import.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def scenario(tiny_pretrain_data, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("fit")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("fit_scenario.py")),
                          tiny_pretrain_data["train"], str(work)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["first"] = {int(k): v for k, v in result["first"].items()}
    result["second"] = {int(k): v for k, v in result["second"].items()}
    return result


def test_fit_runs_without_ray_or_mlflow(scenario):
    assert scenario["loaded"] == []


def test_losses_fall(scenario):
    first = scenario["first"]
    assert sorted(first) == list(range(2, 31, 2))
    curve = [first[s]["loss"] for s in sorted(first)]
    assert sum(curve[-3:]) / 3 < sum(curve[:3]) / 3 - 0.25, curve
    assert {"mlm_loss", "nsp_loss", "mlm_accuracy", "learning_rate", "grad_norm", "sequences_per_second",
            "tokens_per_second", "data_wait_fraction"} <= set(first[30])
    assert "mfu" not in first[30]  # no peak known for a CPU


def test_checkpoints_are_written_with_the_config(scenario):
    assert scenario["kept"] == ["checkpoint-00000020", "checkpoint-00000030"]  # the last 2 kept
    assert scenario["state_step"] == 30 and scenario["state_data_position"] == 30  # global batches: one a step
    assert scenario["state_config_lr"] == 3e-3  # the config's asdict travels with the checkpoint
    assert {"config.json", "model.safetensors", "vocab.txt"} <= set(scenario["model_files"])


def test_second_fit_resumes_on_the_exact_batch_sequence(scenario):
    first, second = scenario["first"], scenario["second"]
    assert scenario["resumed_from"] == 20
    assert sorted(second) == list(range(22, 31, 2))
    for step, metrics in second.items():
        for key in ("loss", "mlm_accuracy", "grad_norm", "learning_rate"):
            assert metrics[key] == pytest.approx(first[step][key], rel=1e-6, abs=1e-9), (step, key)
