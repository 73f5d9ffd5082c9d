"""Object-storage faults survived by a Ray pre-training run (tests/_fault_proxy.py in front of moto on loopback:
503 SlowDown on every fifth request, the answer cut and the connection dropped on every ninth): with its checkpoints
and its export on S3 through the proxy it completes with the same bytes as the same run without faults."""
from __future__ import annotations

import pytest
from _fault_proxy import FaultProxy

from storage import fs as storage_fs
from storage.publish import resolve

pytestmark = pytest.mark.timeout(600)
LINEAGE = "bert_pretrain_run.json"  # names the run: differs between the two runs by design


def _args(data: dict, storage_url: str, export: str, endpoint: str, uri: str, name: str) -> list[str]:
    return ["--data", data["train"], "--preset", "bert_tiny", "--max-steps", "8", "--batch-size", "8",
            "--micro-batch-size", "4", "--num-workers", "1", "--cpus-per-worker", "1", "--lr", "1e-3",
            "--storage", storage_url, "--run-name", name, "--checkpoint-every", "4", "--keep-checkpoints", "2",
            "--log-every", "4", "--export", export, "--endpoint-url", endpoint, "--mlflow-tracking-uri", uri,
            "--experiment", "faults", "--no-system-metrics", "--seed", "5"]


def _tree(url: str, endpoint: str) -> dict[str, bytes]:
    fs, root = storage_fs.filesystem_for(url, endpoint)
    fs.invalidate_cache()
    return {p[len(root):].lstrip("/"): fs.cat_file(p) for p in fs.find(root)}


def test_pretraining_through_faults_gives_the_same_bytes(ray_local, tiny_pretrain_data, s3_bucket, tmp_path):
    from mlflow.tracking import MlflowClient

    from jobs import pretrain

    endpoint, bucket = s3_bucket
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    base = f"s3://{bucket}"
    assert pretrain.main(_args(tiny_pretrain_data, f"{base}/clean", f"{base}/export-clean", endpoint, uri, "r")) == 0
    with FaultProxy(endpoint) as proxy:
        assert pretrain.main(_args(tiny_pretrain_data, f"{base}/faulty", f"{base}/export-faulty", proxy.url, uri,
                                   "r")) == 0
    assert proxy.counts["slowdown"] >= 3 and proxy.counts["dropped"] >= 2, proxy.counts

    clean, faulty = _tree(f"{base}/clean/r", endpoint), _tree(f"{base}/faulty/r", endpoint)
    weights = sorted(k for k in clean if k.endswith(".safetensors"))
    assert [k.split("/")[0] for k in weights] == ["checkpoint-00000004"] * 2 + ["checkpoint-00000008"] * 2
    assert sorted(k for k in faulty if k.endswith(".safetensors")) == weights
    for key in weights:  # the model and the optimizer state of every checkpoint kept, bit for bit
        assert faulty[key] == clean[key], key

    (clean_version, clean_files), (faulty_version, faulty_files) = (resolve(f"{base}/export-{w}", endpoint)
                                                                    for w in ("clean", "faulty"))
    assert faulty_files == clean_files and "model.safetensors" in clean_files
    got, expected = _tree(faulty_version, endpoint), _tree(clean_version, endpoint)
    assert sorted(got) == sorted(expected)
    for name in expected:
        if name != LINEAGE:
            assert got[name] == expected[name], name

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("faults").experiment_id])
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
