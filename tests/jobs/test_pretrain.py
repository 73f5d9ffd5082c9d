"""jobs/pretrain.py end to end on the session's local Ray (2 CPUs): two DDP workers on a tiny real dataset.

One uninterrupted run (module fixture) is checked for learning, MLflow content, checkpoints and the export; a second
run with the same flags, checkpointing to a loopback S3 server, has a worker SIGKILLed after its first checkpoint
and must finish in the same MLflow run with exactly the uninterrupted run's losses; running its command again with
the same --run-name resumes into that run once more.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from _ray_local import ensure_local_ray

from corpus.schema import read_manifest

pytestmark = pytest.mark.timeout(420)

REQUIRED = {"loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "learning_rate", "grad_norm",
            "sequences_per_second", "tokens_per_second", "data_wait_fraction"}
EVAL = {"eval_mlm_accuracy", "eval_nsp_accuracy", "eval_loss"}
STEPS, LOG_EVERY = 40, 2


def job_args(data: dict, storage: str, run_name: str, tracking_uri: str, steps: int = STEPS) -> list[str]:
    return ["--data", data["train"], "--eval-data", data["eval"], "--eval-sequences", "64",
            "--preset", "bert_tiny", "--max-steps", str(steps), "--batch-size", "16", "--micro-batch-size", "4",
            "--num-workers", "2", "--cpus-per-worker", "0.5", "--lr", "3e-3", "--warmup-steps", "2",
            "--storage", storage, "--run-name", run_name, "--checkpoint-every", "10", "--keep-checkpoints", "2",
            "--log-every", str(LOG_EVERY), "--eval-every", "20", "--dynamic-masking", "--length-bucketing",
            "--mlflow-tracking-uri", tracking_uri, "--experiment", "t", "--no-system-metrics", "--seed", "7"]


def history(client, run_id: str, key: str) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for m in client.get_metric_history(run_id, key):
        out.setdefault(m.step, []).append(m.value)
    return out


@pytest.fixture(scope="module")
def baseline(ray_tmpdir, _ray_local_session, tiny_pretrain_data, tmp_path_factory):
    from mlflow.tracking import MlflowClient

    from jobs import pretrain

    ensure_local_ray(ray_tmpdir)  # ray_local's Ray, for a module-scoped fixture

    tmp = tmp_path_factory.mktemp("pretrain-baseline")
    uri = f"sqlite:///{tmp}/mlflow.db"
    export = tmp / "export"
    rc = pretrain.main(job_args(tiny_pretrain_data, str(tmp / "runs"), "base", uri) + ["--export", str(export)])
    assert rc == 0
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    return {"rc": rc, "client": client, "runs": runs, "tmp": tmp, "export": export, "uri": uri}


def test_two_workers_learn_and_mlflow_has_one_complete_run(baseline, tiny_pretrain_data):
    client, runs = baseline["client"], baseline["runs"]
    assert len(runs) == 1, "exactly one MLflow run per job, not one per worker"
    run = client.get_run(runs[0].info.run_id)
    assert run.info.status == "FINISHED"
    p = run.data.params
    assert (p["preset"], p["batch_size"], p["num_workers"], p["grad_accumulation_steps"]) == \
        ("bert_tiny", "16", "2", "2")
    assert p["model.bert.hidden_size"] == "128" and p["model.bert.vocab_size"] == "600"
    assert p["data.train.max_seq_length"] == "64" and p["data.length_buckets"] == "(16, 32, 48, 64)"
    t = run.data.tags
    assert t["dataset.url"] == tiny_pretrain_data["train"] and len(t["dataset.manifest_sha256"]) == 64
    assert t["eval_dataset.url"] == tiny_pretrain_data["eval"] and t["bert.run_name"] == "base"
    # One string for the run's folder (training.job): where Ray Train wrote, and what the job reported.
    assert t["bert.run_checkpoints"] == str((baseline["tmp"] / "runs" / "base").resolve()) and "storage" not in t
    inputs = {i.dataset.digest: {x.key: x.value for x in i.tags}["mlflow.data.context"]
              for i in run.inputs.dataset_inputs}
    assert inputs == {read_manifest(tiny_pretrain_data["train"]).sha256[:16]: "training",
                      read_manifest(tiny_pretrain_data["eval"]).sha256[:16]: "eval"}  # the builds' own datasets

    names = set(run.data.metrics)
    assert REQUIRED | EVAL <= names and "mfu" not in names  # mfu only on GPU
    loss = history(client, run.info.run_id, "loss")
    assert sorted(loss) == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    assert all(len(v) == 1 for v in loss.values())
    curve = [loss[s][0] for s in sorted(loss)]
    assert sum(curve[-3:]) / 3 < sum(curve[:3]) / 3 - 0.25, f"loss did not fall: {curve}"
    assert sorted(history(client, run.info.run_id, "eval_mlm_accuracy")) == [20, 40]
    lr = history(client, run.info.run_id, "learning_rate")
    assert lr[2][0] == pytest.approx(1.5e-3) and lr[STEPS][0] < lr[20][0]  # step 2 of a 2-step warm-up, then decay
    assert 0 <= run.data.metrics["data_wait_fraction"] < 1
    seq = run.data.metrics["sequences_per_second"]
    assert 8 * seq < run.data.metrics["tokens_per_second"] <= 64.001 * seq  # real tokens: at most 64 per sequence

    artifacts = {f.path for f in client.list_artifacts(run.info.run_id, "model")}
    assert {"model/config.json", "model/model.safetensors", "model/vocab.txt",
            "model/bert_pretrain_run.json"} <= artifacts


def test_checkpoints_keep_last_k_and_load_without_pickle(baseline):
    from safetensors.torch import load_file

    ckpts = sorted(p.name for p in (baseline["tmp"] / "runs" / "base").glob("checkpoint-*"))
    assert ckpts == ["checkpoint-00000030", "checkpoint-00000040"]
    last = baseline["tmp"] / "runs" / "base" / ckpts[-1]
    state = json.loads((last / "train_state.json").read_text())
    assert state["step"] == STEPS and state["data_position"]["global_batches"] == STEPS
    assert state["mlflow_run_id"] == baseline["runs"][0].info.run_id
    assert load_file(str(last / "train_state.safetensors"))  # optimizer moments, as plain tensors
    assert (last / "model" / "model.safetensors").is_file() and (last / "model" / "vocab.txt").is_file()


def test_export_loads_in_transformers_with_the_same_outputs(baseline):
    import torch
    import transformers

    from bert_core import BertForPreTraining

    export = baseline["export"]
    lineage = json.loads((export / "bert_pretrain_run.json").read_text())
    assert lineage == {"mlflow_run_id": baseline["runs"][0].info.run_id, "tracking_uri": baseline["uri"]}
    theirs, info = transformers.BertForPreTraining.from_pretrained(export, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    ours = BertForPreTraining.from_pretrained(export).eval()
    ids = torch.randint(5, 600, (2, 24))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        a = theirs.eval()(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))
        b = ours(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))
    torch.testing.assert_close(b.mlm_logits, a.prediction_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(b.nsp_logits, a.seq_relationship_logits, atol=1e-4, rtol=1e-4)
    assert transformers.BertTokenizerFast.from_pretrained(export).vocab_size == 600


def _train_workers() -> list:
    """Ray Train worker processes of *this* test session's Ray (descendants of the pytest process only)."""
    import psutil

    found = []
    for proc in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if "RayTrainWorker" in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_killed_worker_resumes_from_s3_checkpoint_into_the_same_run(baseline, tiny_pretrain_data, s3_bucket,
                                                                     tmp_path):
    import boto3
    from mlflow.tracking import MlflowClient

    from jobs import pretrain

    endpoint, bucket = s3_bucket
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = job_args(tiny_pretrain_data, f"s3://{bucket}/ckpt", "killed", uri) + ["--endpoint-url", endpoint,
                                                                               "--max-failures", "2"]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    killed: list[int] = []
    done = threading.Event()

    def kill_after_first_checkpoint():
        # Kill only once the controller has *registered* checkpoint 10 (its snapshot names it); a checkpoint whose
        # files are uploaded but not yet registered is not one Ray Train would resume from.
        snapshot = "ckpt/killed/checkpoint_manager_snapshot.json"
        while not done.is_set():
            try:
                body = s3.get_object(Bucket=bucket, Key=snapshot)["Body"].read().decode()
            except s3.exceptions.NoSuchKey:
                body = ""
            if "checkpoint-00000010" in body:
                workers = _train_workers()
                if workers:
                    os.kill(workers[-1].pid, signal.SIGKILL)
                    killed.append(workers[-1].pid)
                    return
            time.sleep(0.1)

    watcher = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
    watcher.start()
    try:
        assert pretrain.main(args) == 0
    finally:
        done.set()
        watcher.join(5)
    assert killed, "the run finished before a worker could be killed"

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert len(runs) == 1
    run = client.get_run(runs[0].info.run_id)
    assert run.info.status == "FINISHED" and int(run.data.tags["resumed_from_step"]) >= 10
    loss = history(client, run.info.run_id, "loss")
    assert sorted(loss) == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY)), "a gap in the metric history"
    base_run = baseline["runs"][0].info.run_id
    base_loss = history(baseline["client"], base_run, "loss")
    for step, values in loss.items():
        # Each step is logged once, though the steps after the last checkpoint ran twice; the resume is exact.
        assert len(values) == 1, (step, values)
        assert values[0] == pytest.approx(base_loss[step][0], rel=1e-5), step
    assert history(client, run.info.run_id, "eval_loss")[STEPS][-1] == pytest.approx(
        history(baseline["client"], base_run, "eval_loss")[STEPS][0], rel=1e-5)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert {k.split("/")[2] for k in keys if "/checkpoint-" in k} == {"checkpoint-00000030", "checkpoint-00000040"}

    # The same command again, with more steps: it resumes from step 40 into the same MLflow run, and exports to S3.
    again = [a if a != str(STEPS) else str(STEPS + 4) for a in args] + ["--export", f"s3://{bucket}/exports/killed"]
    assert pretrain.main(again) == 0
    from storage.publish import resolve

    version, files = resolve(f"s3://{bucket}/exports/killed", endpoint)  # the version export.json points at
    exported = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="exports/killed/")["Contents"]}
    assert {version.removeprefix(f"s3://{bucket}/") + f"/{n}" for n in ("config.json", "model.safetensors",
                                                                         "vocab.txt")} <= exported
    assert {"config.json", "model.safetensors", "vocab.txt"} <= set(files)
    runs = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert [r.info.run_id for r in runs] == [run.info.run_id]
    run = client.get_run(run.info.run_id)
    assert run.data.tags["resumed_from_step"] == str(STEPS) and run.info.status == "FINISHED"
    assert sorted(history(client, run.info.run_id, "loss"))[-2:] == [STEPS + 2, STEPS + 4]


def test_phase2_init_from_phase1_export_on_another_dataset(baseline, tiny_pretrain_data, tmp_path):
    """Phase 2 is a second run: --init from phase 1's export (or checkpoint), another dataset, a fresh optimizer."""
    from mlflow.tracking import MlflowClient

    from jobs import pretrain

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    rc = pretrain.main(["--data", tiny_pretrain_data["eval"], "--init", str(baseline["export"]), "--max-steps", "4",
                        "--batch-size", "8", "--num-workers", "1", "--cpus-per-worker", "0.5", "--lr", "1e-4",
                        "--storage", str(tmp_path / "runs"), "--run-name", "phase2", "--checkpoint-every", "4",
                        "--log-every", "2", "--mlflow-tracking-uri", uri, "--experiment", "p2",
                        "--no-system-metrics"])
    assert rc == 0
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("p2").experiment_id])
    assert run.data.tags["lineage.init_run_id"] == baseline["runs"][0].info.run_id
    assert run.data.tags["dataset.url"] == tiny_pretrain_data["eval"]
    first = client.get_metric_history(run.info.run_id, "loss")[0].value
    scratch = history(baseline["client"], baseline["runs"][0].info.run_id, "loss")[LOG_EVERY][0]
    assert first < scratch - 0.3  # it starts from the trained weights, not from scratch
