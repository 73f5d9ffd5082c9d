"""tracking.datasets.log_dataset: a built dataset recorded on a run is an MLflow dataset (name, source URL, the
manifest's sha256 as digest, profile, schema), read back from a real store; the build's output and a training run's
input are one identity."""
from __future__ import annotations

import json

from corpus.schema import read_manifest
from tracking.datasets import log_dataset


def test_a_built_dataset_logged_as_output_and_as_training_input_reads_back_as_one(tiny_pretrain_data, mlflow_uri):
    from mlflow.tracking import MlflowClient

    manifest = read_manifest(tiny_pretrain_data["train"])
    client = MlflowClient(mlflow_uri)
    exp = client.create_experiment("datasets")
    build_run = client.create_run(exp, run_name="build").info.run_id
    train_run = client.create_run(exp, run_name="pretrain").info.run_id
    log_dataset(mlflow_uri, build_run, manifest, "output")
    log_dataset(mlflow_uri, train_run, manifest, "training")
    log_dataset(mlflow_uri, train_run, manifest, "training")  # a resumed pre-training run logs it again: once

    seen = {}
    for run_id in (build_run, train_run):
        [inp] = client.get_run(run_id).inputs.dataset_inputs
        seen[run_id] = inp
        assert inp.dataset.name == "train"
        assert inp.dataset.digest == manifest.sha256[:16]
        assert json.loads(inp.dataset.source)["uri"] == tiny_pretrain_data["train"]
        profile = json.loads(inp.dataset.profile)
        assert profile["instances"] == manifest.instances > 0
        assert profile["shards"] == len(manifest.shards) == 4 and profile["vocab_size"] == 600
        columns = [c["name"] for c in json.loads(inp.dataset.schema)["mlflow_colspec"]]
        assert columns == ["input_ids", "a_length", "masked_lm_positions", "masked_lm_ids", "next_sentence_label"]
    assert {t.key: t.value for t in seen[build_run].tags}["mlflow.data.context"] == "output"
    assert {t.key: t.value for t in seen[train_run].tags}["mlflow.data.context"] == "training"
