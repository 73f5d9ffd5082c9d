"""`--init` from a URL: models fetched from the loopback S3 server (moto) into a cache under the work directory."""
from __future__ import annotations

import boto3
import pytest
import torch

from bert_core import BertForPreTraining, bert_tiny
from storage.fs import upload_tree
from training.model_fetch import MANIFEST, fetch_model


@pytest.fixture
def model_dir(tmp_path):
    torch.manual_seed(0)
    model = BertForPreTraining(bert_tiny(vocab_size=120))
    export = tmp_path / "export"
    model.save_pretrained(export)
    (export / "bert_pretrain_run.json").write_text('{"mlflow_run_id": "abc"}\n')
    return model, export


def test_an_export_is_fetched_once_and_loads(model_dir, s3_bucket, tmp_path):
    endpoint, bucket = s3_bucket
    model, export = model_dir
    upload_tree(export, f"s3://{bucket}/models/phase1", endpoint)
    cache = tmp_path / "work" / "init-cache"

    local = fetch_model(f"s3://{bucket}/models/phase1", cache, endpoint)
    assert local.parent == cache and (local / MANIFEST).is_file()
    assert {p.name for p in local.iterdir()} >= {"config.json", "model.safetensors", "bert_pretrain_run.json"}
    loaded = BertForPreTraining.from_pretrained(local)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)

    (local / "marker").write_text("kept")  # a second call reuses the copy...
    assert fetch_model(f"s3://{bucket}/models/phase1", cache, endpoint) == local and (local / "marker").exists()
    boto3.client("s3", endpoint_url=endpoint).put_object(Bucket=bucket, Key="models/phase1/config.json",
                                                        Body=(export / "config.json").read_bytes() + b"\n")
    refetched = fetch_model(f"s3://{bucket}/models/phase1", cache, endpoint)  # ...until the model changes there
    assert refetched != local and not (refetched / "marker").exists()
    assert not list(cache.glob(".fetching-*"))  # nothing half-written left behind


def test_a_checkpoint_brings_only_its_model(model_dir, s3_bucket, tmp_path):
    endpoint, bucket = s3_bucket
    _, export = model_dir
    ckpt = tmp_path / "checkpoint-00000010"
    (ckpt / "model").mkdir(parents=True)
    for f in export.iterdir():
        (ckpt / "model" / f.name).write_bytes(f.read_bytes())
    (ckpt / "train_state.safetensors").write_bytes(b"\0" * 1000)
    upload_tree(ckpt, f"s3://{bucket}/runs/r1/checkpoint-00000010", endpoint)

    local = fetch_model(f"s3://{bucket}/runs/r1/checkpoint-00000010", tmp_path / "cache", endpoint)
    assert (local / "model" / "model.safetensors").is_file() and not (local / "train_state.safetensors").exists()
    assert BertForPreTraining.from_pretrained(local).config.vocab_size == 120  # a checkpoint dir loads as before


def test_a_url_without_a_model_says_so(s3_bucket, tmp_path):
    endpoint, bucket = s3_bucket
    boto3.client("s3", endpoint_url=endpoint).put_object(Bucket=bucket, Key="notes/readme.txt", Body=b"hi")
    with pytest.raises(ValueError, match=r"--init s3://.*/notes: no model there \(found 1 files"):
        fetch_model(f"s3://{bucket}/notes", tmp_path / "cache", endpoint)
    with pytest.raises(ValueError, match=r"s3://nosuchbucket-x/model.*(no model there|does not exist)"):
        fetch_model("s3://nosuchbucket-x/model", tmp_path / "cache", endpoint)


def test_local_paths_pass_through(tmp_path):
    assert fetch_model(str(tmp_path / "m"), tmp_path / "cache") == tmp_path / "m"
    assert fetch_model(f"file://{tmp_path}/m", tmp_path / "cache") == tmp_path / "m"
    assert not (tmp_path / "cache").exists()


def test_a_key_that_leaves_the_models_folder_is_refused(model_dir, s3_bucket, tmp_path):
    """Whoever can write the bucket names the files: `models/x/../../escaped` must not land outside the cache."""
    endpoint, bucket = s3_bucket
    _, export = model_dir
    upload_tree(export, f"s3://{bucket}/models/x", endpoint)
    boto3.client("s3", endpoint_url=endpoint).put_object(Bucket=bucket, Key="models/x/../../escaped", Body=b"pwned")
    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket=bucket)["Contents"]]
    assert "models/x/../../escaped" in keys  # the store keeps the name as written
    with pytest.raises(ValueError, match=r"s3://.*/models/x: file '\.\./\.\./escaped' is not a relative name"):
        fetch_model(f"s3://{bucket}/models/x", tmp_path / "work" / "cache", endpoint)
    assert not list(tmp_path.rglob("escaped"))
