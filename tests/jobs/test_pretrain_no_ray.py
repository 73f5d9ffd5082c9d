"""jobs/pretrain.py --no-ray: the same flags -> PretrainConfig -> pretraining.loop.fit, in the job's process (no Ray
started). One MLflow run per job with the config as params; checkpoints under STORAGE/RUN_NAME; a rerun with more
steps resumes from the last checkpoint into the same run, each (metric, step) logged once; the export loads."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(300)


def test_no_ray_run_resumes_into_the_same_mlflow_run(tiny_pretrain_data, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from jobs import pretrain
    from pretraining import batches

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = ["--data", tiny_pretrain_data["train"], "--eval-data", tiny_pretrain_data["eval"], "--eval-sequences",
            "32", "--preset", "bert_tiny", "--max-steps", "6", "--batch-size", "8", "--micro-batch-size", "4",
            "--threads", "1", "--lr", "1e-3", "--storage", str(tmp_path / "runs"), "--run-name", "local",
            "--checkpoint-every", "3", "--keep-checkpoints", "2", "--log-every", "2", "--no-ray",
            "--mlflow-tracking-uri", uri, "--experiment", "nr", "--no-system-metrics", "--seed", "3"]
    assert pretrain.main(args) == 0
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("nr").experiment_id])
    assert run.info.status == "FINISHED"
    p = run.data.params
    assert p["no_ray"] == "True" and p["data.accum"] == "2" and p["model.bert.num_hidden_layers"] == "2"
    assert p["data.batch_size"] == "8"
    # The launcher's folder.
    assert run.data.tags["bert.run_checkpoints"] == str((tmp_path / "runs" / "local").resolve())
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [2, 4, 6]
    assert {"eval_loss", "run_sequences_per_second", "run_data_wait_fraction"} <= set(run.data.metrics)
    # No --eval-every: a few evaluations over the run (a curve, not a dot), with what the collapse check reads.
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval_loss")] == [2, 4, 6]
    assert 0 < run.data.metrics["eval_mlm_predicted_top_share"] <= 1
    ckpts = sorted(p.name for p in (tmp_path / "runs" / "local").iterdir())
    assert ckpts == ["checkpoint-00000003", "checkpoint-00000006"]
    state = json.loads((tmp_path / "runs" / "local" / ckpts[-1] / "train_state.json").read_text())
    assert state["mlflow_run_id"] == run.info.run_id and state["config"]["max_steps"] == 6
    # The run's own settings replay its batches: the digests its checkpoints recorded, step by step.
    recorded = {int(k): v for c in ckpts for k, v in json.loads(
        (tmp_path / "runs" / "local" / c / "train_state.json").read_text())["data_digests"].items()}
    assert sorted(recorded) == [1, 2, 3, 4, 5, 6]
    capsys.readouterr()  # the job's own summary line
    assert batches.main(["--run", str(tmp_path / "runs" / "local"), "--steps", "1:6"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"step {k}: {v}" for k, v in sorted(recorded.items())]

    export = tmp_path / "export"
    assert pretrain.main([a if a != "6" else "8" for a in args] + ["--export", str(export)]) == 0
    (again,) = client.search_runs([client.get_experiment_by_name("nr").experiment_id])
    assert again.info.run_id == run.info.run_id and again.data.tags["resumed_from_step"] == "6"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [2, 4, 6, 8]
    import transformers

    model, info = transformers.BertForPreTraining.from_pretrained(export, output_loading_info=True)
    assert not info["missing_keys"] and model.config.vocab_size == 600


@pytest.mark.parametrize("lr", [None, "1e-7"])
def test_a_short_run_near_the_baseline_is_a_note_and_a_rate_too_low_one_warning(tiny_pretrain_data, tmp_path, caplog,
                                                                               capsys, lr):
    """Six steps at the default rate: accuracy near the top token's share, but learning: no WARNING (it said 'try a
    higher --lr (this run: 0.002)'). At --lr 1e-7 the loss stays where it started: one WARNING, the default named."""
    import logging

    from jobs import pretrain

    caplog.set_level(logging.INFO)
    args = ["--data", tiny_pretrain_data["train"], "--eval-data", tiny_pretrain_data["eval"], "--eval-sequences",
            "32", "--preset", "bert_tiny", "--max-steps", "6", "--batch-size", "8", "--threads", "1", "--storage",
            str(tmp_path / "runs"), "--log-every", "2", "--no-ray", "--mlflow-tracking-uri",
            f"sqlite:///{tmp_path}/mlflow.db", "--no-system-metrics", "--seed", "3"] + (["--lr", lr] if lr else [])
    assert pretrain.main(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "collapse" in r.getMessage()]
    if lr is None:
        assert warned == [] and result["collapse"] is None
        assert result["eval_mlm_accuracy"] > 1.25 * result["eval_mlm_top_token_share"] or any(
            r.getMessage().startswith("not a collapse: ") for r in caplog.records if r.levelname == "INFO")
    else:
        assert len(warned) == 1 and warned[0] == result["collapse"]
        assert "try a higher --lr (this run: 1e-07): the default for this model's width is 0.002" in warned[0]
