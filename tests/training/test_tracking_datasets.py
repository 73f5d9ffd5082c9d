"""training.tracking.log_dataset: a built dataset recorded on a run is an MLflow dataset (name, source URL, the
manifest's digest, profile, schema), read back from a real store; the same call on two runs gives one identity."""
from __future__ import annotations

import json

from pipeline.schema import manifest_digest, read_manifest
from training.tracking import log_dataset


def test_a_built_dataset_logged_as_a_training_input_reads_back_with_the_manifests_digest(tiny_pretrain_data,
                                                                                        mlflow_uri):
    from mlflow.tracking import MlflowClient

    url = tiny_pretrain_data["train"]
    manifest = read_manifest(url)
    client = MlflowClient(mlflow_uri)
    exp = client.create_experiment("datasets")
    build_run = client.create_run(exp, run_name="build").info.run_id
    train_run = client.create_run(exp, run_name="pretrain").info.run_id
    log_dataset(mlflow_uri, build_run, url, manifest, "output")
    log_dataset(mlflow_uri, train_run, url, manifest, "training")

    seen = {}
    for run_id in (build_run, train_run):
        [inp] = client.get_run(run_id).inputs.dataset_inputs
        seen[run_id] = inp
        assert inp.dataset.name == "train"
        assert inp.dataset.digest == manifest_digest(manifest)
        assert json.loads(inp.dataset.source)["uri"] == url
        profile = json.loads(inp.dataset.profile)
        assert profile["instances"] == manifest["totals"]["instances"] > 0
        assert profile["shards"] == len(manifest["shards"]) == 4
        columns = [c["name"] for c in json.loads(inp.dataset.schema)["mlflow_colspec"]]
        assert columns == ["input_ids", "a_length", "masked_lm_positions", "masked_lm_ids", "next_sentence_label"]
    assert {t.key: t.value for t in seen[build_run].tags}["mlflow.data.context"] == "output"
    assert {t.key: t.value for t in seen[train_run].tags}["mlflow.data.context"] == "training"


def test_the_digest_ignores_the_build_time_and_nothing_else(tiny_pretrain_data):
    m = read_manifest(tiny_pretrain_data["train"])
    assert manifest_digest(m | {"build_seconds": 1234.5}) == manifest_digest(m)
    assert manifest_digest(m | {"totals": m["totals"] | {"instances": m["totals"]["instances"] + 1}}) != \
        manifest_digest(m)
