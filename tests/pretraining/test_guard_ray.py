"""The guard under Ray Train (the session's local Ray, two DDP workers, checkpoints in Ray's storage, a real MLflow
store): a run of poisoned batches on one rank rolls both ranks back to the last checkpoint Ray persisted (rank 0's,
broadcast) past the poisoned batches; a divergent learning rate ends every worker with the guard's verdict as the
run's return value, with no worker-group restart (which would only replay the divergence)."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import poison
import pytest
import ray.cloudpickle
import torch
from safetensors.torch import load_file
from test_fit_guard import config, mlflow_run

from tracking.config import RunRef

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]
ray.cloudpickle.register_pickle_by_value(poison)  # the test's helpers travel to the workers with the function


def train(loop, loop_config: dict, storage: Path, name: str):
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(
        loop, train_loop_config=loop_config, torch_config=TorchConfig(backend="gloo"),
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=ray.train.RunConfig(name=name, storage_path=str(storage),
                                       checkpoint_config=ray.train.CheckpointConfig(num_to_keep=5),
                                       failure_config=ray.train.FailureConfig(max_failures=2)),
    ).fit()


def checkpoints(run_dir: Path) -> dict[str, dict]:
    out = {}
    for d in sorted(run_dir.glob("checkpoint-*")):
        for f in (d / "model" / "model.safetensors", d / "train_state.safetensors"):
            assert all(torch.isfinite(t).all() for t in load_file(str(f)).values()), f
        out[d.name] = json.loads((d / "train_state.json").read_text())
    return out


def test_poisoned_batches_on_one_rank_roll_both_back(ray_local, tiny_pretrain_data, tmp_path, mlflow_uri):
    client, run_id = mlflow_run(mlflow_uri)
    cfg = config(tiny_pretrain_data["train"], tmp_path)
    marks = poison.step_fingerprints(cfg.data, cfg.model.bert.vocab_size, cfg.runtime.seed, [23, 24, 25, 26, 27],
                                     rank=0, world=2)
    result = train(poison.ray_loop, {"config": cfg, "marks": marks, "tracking": RunRef(mlflow_uri, run_id)},
                   tmp_path / "ray", "poisoned")

    assert result.error is None and result.return_value == {"step": 40, "hits": 5}
    states = checkpoints(tmp_path / "ray" / "poisoned")
    assert list(states) == [f"checkpoint-000000{s}" for s in (10, 20, 30, 40)]
    assert states["checkpoint-00000040"]["guard"] == {"rollbacks": 1, "skipped_batches": 10}
    run = client.get_run(run_id)
    assert "rolled back to step 20" in run.data.tags["guard.rollback.1"]
    assert run.data.metrics["rollbacks"] == 1 and math.isfinite(run.data.metrics["loss"])


def test_a_divergent_learning_rate_returns_the_verdict_without_restarts(ray_local, tiny_pretrain_data, tmp_path,
                                                                        mlflow_uri):
    from pretraining.loop import fit
    from training.launch import ray_worker

    client, run_id = mlflow_run(mlflow_uri)
    cfg = config(tiny_pretrain_data["train"], tmp_path, steps=30, lr=1e4, every=2)
    result = train(ray_worker, {"fit": fit, "config": cfg, "threads": 1, "inputs": None,
                                "tracking": RunRef(mlflow_uri, run_id)}, tmp_path / "ray", "divergent")

    assert result.error is None
    verdict = result.return_value["error"]
    assert verdict.startswith("training diverged at step ")
    assert re.search(r"--lr \S+ \(.*this run(: |'s )10000\)", verdict)
    assert checkpoints(tmp_path / "ray" / "divergent")  # the early ones, finite
    assert client.get_run(run_id).data.tags["guard.diverged"] == verdict
    assert "resumed_from_step" not in client.get_run(run_id).data.tags  # no worker-group restart happened
