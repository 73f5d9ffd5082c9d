"""`pretraining.loop.fit` guards itself (CPU, bert_tiny, real shards, real MLflow store read back with MlflowClient):

- one poisoned batch (NaN loss through the real backward): its update is skipped and counted, the run finishes;
- five poisoned batches in a row: the run rolls back to its last checkpoint, skips the batches since then (the
  poisoned ones are never seen again) and finishes, with the rollback in its metrics, tags and checkpoints, its line
  naming the examples of the batch that tripped it;
- a divergent learning rate: rollbacks do not help, `fit` raises `TrainingDiverged` naming the step and the flags
  to change, and every checkpoint written holds finite tensors only.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from poison import Poisoned, step_fingerprints
from safetensors.torch import load_file

from bert_core import bert_tiny
from corpus.schema import read_manifest
from pretraining.batches import Replay, steps
from pretraining.config import CheckpointConfig, ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig
from pretraining.loader import DataConfig
from pretraining.loop import fit
from pretraining.order import describe, digest
from tracking.config import RunRef, TrackingConfig
from tracking.tracker import make_tracker
from training.checkpoint import LocalCheckpoints
from training.guard import TrainingDiverged
from training.worker import Worker

pytestmark = pytest.mark.timeout(300)


def config(dataset: str, work: Path, steps: int = 40, lr: float = 3e-3, tracking: TrackingConfig | None = None,
           every: int = 10) -> PretrainConfig:
    vocab = Path(dataset, "vocab.txt").read_text().splitlines()
    return PretrainConfig(
        model=ModelConfig(bert=bert_tiny(vocab_size=len(vocab), max_position_embeddings=64)),
        data=DataConfig(train=read_manifest(dataset), micro_batch_size=8, mask_id=vocab.index("[MASK]")),
        max_steps=steps,
        optimizer=OptimizerConfig(lr=lr, warmup_steps=2),
        checkpoint=CheckpointConfig(every=every),
        tracking=tracking or TrackingConfig(log_every=5),
        runtime=RuntimeConfig(device="cpu", threads=1, seed=7),
    )


def mlflow_run(uri: str) -> tuple[object, str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.create_experiment("guard")
    return client, client.create_run(exp).info.run_id


def poisoned_worker(cfg: PretrainConfig, steps: list[int], work: Path, tracker=None) -> tuple[Worker, list[Poisoned]]:
    marks = step_fingerprints(cfg.data, cfg.model.bert.vocab_size, cfg.runtime.seed, steps)
    wrapped: list[Poisoned] = []

    def wrap(model):
        wrapped.append(Poisoned(model, marks))
        return wrapped[-1]

    return Worker(wrap=wrap, tracker=tracker, checkpoints=LocalCheckpoints(work / "ckpt", keep=5)), wrapped


def finite_checkpoints(directory: Path) -> list[str]:
    names = sorted(p.name for p in directory.glob("checkpoint-*"))
    for name in names:
        for f in (directory / name / "model" / "model.safetensors", directory / name / "train_state.safetensors"):
            for key, t in load_file(str(f)).items():
                assert torch.isfinite(t).all(), f"{name}/{f.name}: {key} is not finite"
    return names


def test_one_poisoned_batch_is_skipped_and_counted(tiny_pretrain_data, tmp_path, mlflow_uri):
    client, run_id = mlflow_run(mlflow_uri)
    cfg = config(tiny_pretrain_data["train"], tmp_path)
    worker, wrapped = poisoned_worker(cfg, [7], tmp_path, make_tracker(RunRef(mlflow_uri, run_id)))
    result = fit(cfg, worker)

    assert result.step == 40 and wrapped[0].hits == 1
    at = dict(result.history)
    assert at[10]["nonfinite_steps"] == 1 and at[10]["nonfinite_batches"] == 1 and math.isfinite(at[10]["loss"])
    assert all(m["nonfinite_steps"] == 0 and m["rollbacks"] == 0 for s, m in result.history if s != 10)
    final = tmp_path / "ckpt" / "checkpoint-00000040"
    steps = {k: v for k, v in load_file(str(final / "train_state.safetensors")).items() if k.endswith(".step")}
    assert steps and all(int(v) == 39 for v in steps.values())  # 40 steps, one of them skipped
    assert finite_checkpoints(tmp_path / "ckpt")

    history = {m.step: m.value for m in client.get_metric_history(run_id, "nonfinite_steps")}
    assert history[10] == 1 and sum(history.values()) == 1
    assert math.isfinite(client.get_metric_history(run_id, "loss")[1].value)


def test_a_run_of_poisoned_batches_rolls_back_past_them(tiny_pretrain_data, tmp_path, mlflow_uri):
    client, run_id = mlflow_run(mlflow_uri)
    cfg = config(tiny_pretrain_data["train"], tmp_path)
    worker, wrapped = poisoned_worker(cfg, [23, 24, 25, 26, 27], tmp_path, make_tracker(RunRef(mlflow_uri, run_id)))
    result = fit(cfg, worker)

    assert result.step == 40
    # Five NaN steps (the guard's limit) are seen once: the review at step 30 rolls back to checkpoint 20 and the
    # data moves on past steps 21-30's batches, so the poisoned ones are never replayed.
    assert wrapped[0].hits == 5
    logged = [s for s, _ in result.history]
    assert logged == [5, 10, 15, 20, 25, 30, 25, 30, 35, 40]
    at25, at30 = result.history[4][1], result.history[5][1]
    assert at25["nonfinite_steps"] == 3 and at25["rollbacks"] == 0  # steps 23-25: under the limit of 5
    assert at30["nonfinite_steps"] == 2 and at30["rollbacks"] == 1 and at30["skipped_batches"] == 10
    assert result.history[-1][1]["rollbacks"] == 1 and math.isfinite(result.history[-1][1]["loss"])

    names = finite_checkpoints(tmp_path / "ckpt")
    assert names == [f"checkpoint-000000{s}" for s in (10, 20, 30, 40)]
    state = json.loads((tmp_path / "ckpt" / names[-1] / "train_state.json").read_text())
    assert state["guard"] == {"rollbacks": 1, "skipped_batches": 10}
    assert state["data_position"]["global_batches"] == 50  # 40 steps + 10 skipped

    run = client.get_run(run_id)
    assert "rolled back to step 20" in run.data.tags["guard.rollback.1"]
    assert "skipping the batches of steps 21-30" in run.data.tags["guard.rollback.1"]
    # The line names the examples of the batch that tripped the guard (step 27), as the data order has them.
    (_, held, _), = steps(Replay(cfg.data, cfg.runtime.seed, cfg.model.bert.vocab_size), 27, 27)
    assert f"examples (shard:row) {describe(held)}, digest {digest(held)}" in run.data.tags["guard.rollback.1"]
    assert client.get_metric_history(run_id, "rollbacks")[-1].value == 1


def test_a_divergent_learning_rate_fails_naming_the_step_and_the_flags(tiny_pretrain_data, tmp_path, mlflow_uri):
    client, run_id = mlflow_run(mlflow_uri)
    cfg = config(tiny_pretrain_data["train"], tmp_path, steps=30, lr=1e4, every=2)
    with pytest.raises(TrainingDiverged) as failure:
        fit(cfg, Worker(checkpoints=LocalCheckpoints(tmp_path / "ckpt", keep=5), tracking=RunRef(mlflow_uri, run_id)))
    message = str(failure.value)
    assert message.startswith("training diverged at step ") and "non-finite loss or gradient" in message
    assert re.search(r"--lr \S+ \(.*this run(: |'s )10000\)", message)
    assert "--max-grad-norm" in message and "3 rollbacks" in message
    assert finite_checkpoints(tmp_path / "ckpt")  # the early ones exist, and are finite

    run = client.get_run(run_id)
    assert run.data.tags["guard.diverged"] == message
    losses = [m.value for m in client.get_metric_history(run_id, "loss")]
    norms = [m.value for m in client.get_metric_history(run_id, "grad_norm")]
    # The divergence is charted as what it is (a NaN gradient norm, and a NaN or huge loss), not dropped, not 0.
    assert any(math.isnan(v) for v in norms + losses) and all(v != 0 for v in losses)
    assert run.data.metrics["rollbacks"] == 3
