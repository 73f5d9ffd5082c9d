"""jobs/pretrain.py on a two-node Ray cluster on one machine (ray.cluster_utils.Cluster, 1 CPU per node).

With one CPU per node and one CPU per worker, the two DDP workers can only be placed on different nodes, so the
gloo process group really spans nodes (all on 127.0.0.1).
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(300)


def test_two_node_cluster_run_completes(ray_shutdown, tiny_pretrain_data, tmp_path):
    import ray
    from mlflow.tracking import MlflowClient
    from ray.cluster_utils import Cluster

    from jobs import pretrain

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        uri = f"sqlite:///{tmp_path}/mlflow.db"
        rc = pretrain.main([
            "--data", tiny_pretrain_data["train"], "--preset", "bert_tiny", "--max-steps", "6", "--batch-size", "8",
            "--num-workers", "2", "--cpus-per-worker", "1", "--lr", "1e-3", "--storage", str(tmp_path / "runs"),
            "--run-name", "two-nodes", "--checkpoint-every", "3", "--log-every", "3", "--mlflow-tracking-uri", uri,
            "--experiment", "multinode", "--no-system-metrics"])
        assert rc == 0
        client = MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("multinode").experiment_id])
        assert run.info.status == "FINISHED" and run.data.params["num_workers"] == "2"
        assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [3, 6]
        assert (tmp_path / "runs" / "two-nodes" / "checkpoint-00000006" / "model" / "model.safetensors").is_file()
    finally:
        ray.shutdown()
        cluster.shutdown()
