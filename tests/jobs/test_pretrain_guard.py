"""jobs/pretrain.py as a new user runs it, for what issue 17 found: a divergent learning rate fails (one line naming
the step and what to try, exit status 2, the MLflow run FAILED, every checkpoint finite) instead of reporting
success; a micro-batch that cannot fit fails in seconds naming the flag, or the job sizes one that fits; `--init`
takes an s3:// URL."""
from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from jobs import pretrain
from pretraining import memory
from tracking.store import DEFAULT_EXPERIMENT

pytestmark = pytest.mark.timeout(420)


def run(argv: list[str], caplog) -> tuple[int, list[logging.LogRecord]]:
    caplog.clear()
    with caplog.at_level(logging.INFO):
        rc = pretrain.main(argv)
    return rc, [r for r in caplog.records if r.levelno >= logging.ERROR and r.name == "jobs.pretrain"]


def test_a_divergent_learning_rate_fails_the_job(ray_local, tiny_pretrain_data, tmp_path, mlflow_uri, caplog):
    from mlflow.tracking import MlflowClient

    # The new-user reproduction (--preset bert_tiny --lr 1e4 --max-steps 30), with checkpoints early enough to check.
    rc, errors = run(["--data", tiny_pretrain_data["train"], "--preset", "bert_tiny", "--lr", "1e4", "--max-steps",
                      "30", "--checkpoint-every", "2", "--log-every", "5", "--storage", str(tmp_path / "runs"),
                      "--run-name", "lr1e4", "--mlflow-tracking-uri", mlflow_uri, "--no-system-metrics",
                      "--export", str(tmp_path / "export")], caplog)
    assert rc == 2
    (error,) = errors
    message = error.getMessage()
    assert error.exc_info is None and "\n" not in message  # one line, no traceback
    assert message.startswith("training diverged at step ")
    assert re.search(r"--lr \S+ \(.*this run(: |'s )10000\)", message)

    client = MlflowClient(mlflow_uri)
    (found,) = client.search_runs([client.get_experiment_by_name(DEFAULT_EXPERIMENT).experiment_id])
    assert found.info.status == "FAILED"
    assert found.data.tags["guard.diverged"] == message and found.data.metrics["rollbacks"] == 3
    assert any(math.isnan(m.value) for m in client.get_metric_history(found.info.run_id, "loss"))
    checkpoints = sorted((tmp_path / "runs" / "lr1e4").glob("checkpoint-*"))
    assert checkpoints  # the early ones were written, and every tensor in them is finite
    for ckpt in checkpoints:
        for f in (ckpt / "model" / "model.safetensors", ckpt / "train_state.safetensors"):
            assert all(torch.isfinite(t).all() for t in load_file(str(f)).values()), f
    assert not (tmp_path / "export").exists()  # nothing exported from a failed run


def test_a_micro_batch_that_cannot_fit_fails_at_once_naming_the_flag(tiny_pretrain_data, tmp_path, mlflow_uri,
                                                                      caplog):
    from mlflow.tracking import MlflowClient

    rc, errors = run(["--data", tiny_pretrain_data["train"], "--preset", "bert_base", "--max-steps", "5",
                      "--batch-size", "256", "--micro-batch-size", "256", "--memory-gb", "4",
                      "--storage", str(tmp_path / "runs"), "--mlflow-tracking-uri", mlflow_uri], caplog)
    assert rc == 2
    (error,) = errors
    assert error.getMessage().startswith("--micro-batch-size 256 needs ~")
    assert "use --micro-batch-size 16 (gradient accumulation keeps --batch-size)" in error.getMessage()
    # Before any worker, checkpoint or MLflow run.
    assert not (tmp_path / "runs").exists()
    assert MlflowClient(mlflow_uri).get_experiment_by_name(DEFAULT_EXPERIMENT) is None


def test_without_a_micro_batch_the_job_sizes_one_that_fits(tiny_pretrain_data, tmp_path, mlflow_uri, caplog, capsys):
    """The defaults' reproduction, sized instead of dying in Ray's memory dump: bert_base at --batch-size 256 gets
    a micro-batch that fits (checked on the config, not trained: bert_base on 2 CPUs takes minutes a step); a tiny
    run with a budget too small for its whole batch trains with accumulation."""
    from mlflow.tracking import MlflowClient

    args = pretrain.parse_args(["--data", tiny_pretrain_data["train"], "--max-steps", "5", "--memory-gb", "16",
                                "--run-name", "sized"])
    config = pretrain.job_from(args).config
    assert config.data.micro_batch_size * config.data.accum == 256 and config.data.accum > 1
    assert memory.estimate(config.model.bert, config.data.micro_batch_size, 64, 10).total <= 16 * 2**30 * 0.8

    from bert_core import bert_tiny

    budget = memory.estimate(bert_tiny(vocab_size=600), 8, 64, 10).total / memory.HEADROOM / 2**30 + 1e-6
    rc, errors = run(["--data", tiny_pretrain_data["train"], "--preset", "bert_tiny", "--max-steps", "4",
                      "--batch-size", "32", "--memory-gb", f"{budget:.6f}", "--no-ray", "--log-every", "2",
                      "--storage", str(tmp_path / "runs"), "--run-name", "sized", "--mlflow-tracking-uri", mlflow_uri,
                      "--no-system-metrics"], caplog)
    assert rc == 0 and not errors
    params = MlflowClient(mlflow_uri).get_run(json.loads(capsys.readouterr().out.strip().splitlines()[-1])
                                              ["mlflow_run_id"]).data.params
    assert (params["micro_batch_size_resolved"], params["grad_accumulation_steps"]) == ("8", "4")
    assert any("training with micro-batches of 8 and 4 accumulation steps" in r.getMessage() for r in caplog.records)


def test_init_from_s3(tiny_pretrain_data, tmp_path, mlflow_uri, s3_bucket, caplog, capsys):
    """Phase 1 exports to the loopback S3 server, phase 2 starts from that URL: fetched into the storage's
    .init-cache, its lineage read from the fetched copy."""
    endpoint, bucket = s3_bucket
    common = ["--data", tiny_pretrain_data["train"], "--max-steps", "2", "--batch-size", "8", "--no-ray",
              "--storage", str(tmp_path / "runs"), "--mlflow-tracking-uri", mlflow_uri, "--no-system-metrics",
              "--endpoint-url", endpoint]
    rc, _ = run([*common, "--preset", "bert_tiny", "--run-name", "phase1", "--export", f"s3://{bucket}/m/phase1"],
                caplog)
    assert rc == 0
    phase1 = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rc, errors = run([*common, "--init", f"s3://{bucket}/m/phase1", "--run-name", "phase2"], caplog)
    assert rc == 0 and not errors
    phase2 = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (cached,) = (tmp_path / "runs" / ".init-cache").iterdir()
    assert {"config.json", "model.safetensors", "bert_pretrain_run.json"} <= {p.name for p in cached.iterdir()}

    from mlflow.tracking import MlflowClient

    tags = MlflowClient(mlflow_uri).get_run(phase2["mlflow_run_id"]).data.tags
    assert tags["init"] == f"s3://{bucket}/m/phase1" and tags["lineage.init_run_id"] == phase1["mlflow_run_id"]
    assert Path(tmp_path / "runs" / "phase2").is_dir()
