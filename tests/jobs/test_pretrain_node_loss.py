"""A node removed mid-training: jobs/pretrain.py on a `ray.cluster_utils.Cluster` (every node on 127.0.0.1) whose head
has no CPU and two nodes have one each, so the one training worker (1 CPU) runs on one of them and the other is
spare. Once Ray Train's controller has registered a checkpoint (its snapshot beside the checkpoints names it; a
checkpoint folder on disk is not enough, the controller may not have heard of it yet), the worker's node (the one
whose CPU is taken) is removed, abruptly (its raylet and the worker die, as when a machine goes away): Ray Train
restarts the group on the spare node, which resumes from that checkpoint, and the run finishes in the same MLflow run
(one run, FINISHED, tagged with the step it resumed from; the last step's metrics logged).

Nothing here depends on timing but the kill landing before the run ends: the run is 10x longer than the step the kill
waits for, and a run that ended first fails the test rather than passing it (no resume tag). Slow: three raylets and
two worker starts on a 2-core box."""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from _ray_checkpoints import registered_step

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS, EVERY = 80, 4


def _checkpoints(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*/checkpoint-*") if p.is_dir())


def _last_step(root: Path) -> int:
    return max((int(m.group(1)) for p in _checkpoints(root) if (m := re.fullmatch(r"checkpoint-(\d+)", p.name))),
               default=0)


def test_a_removed_node_resumes_from_the_last_checkpoint_in_the_same_run(ray_shutdown, tiny_pretrain_data, tmp_path):
    import ray
    from mlflow.tracking import MlflowClient
    from ray._private.state import available_resources_per_node
    from ray.cluster_utils import Cluster

    from jobs import pretrain

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=1), cluster.add_node(num_cpus=1)]
    storage, uri = tmp_path / "runs", f"sqlite:///{tmp_path}/mlflow.db"
    outcome: dict = {}
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        job = threading.Thread(target=lambda: outcome.update(rc=pretrain.main([
            "--data", tiny_pretrain_data["train"], "--preset", "bert_tiny", "--max-steps", str(STEPS),
            "--batch-size", "16", "--num-workers", "1", "--cpus-per-worker", "1", "--lr", "1e-3",
            "--storage", str(storage), "--run-name", "node-loss", "--checkpoint-every", str(EVERY),
            "--keep-checkpoints", "2", "--max-failures", "2", "--log-every", str(EVERY),
            "--mlflow-tracking-uri", uri, "--experiment", "faults", "--no-system-metrics"])), daemon=True)
        job.start()
        deadline = time.monotonic() + 600
        while registered_step(storage) < EVERY and job.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        registered = registered_step(storage)
        assert registered >= EVERY, "no checkpoint registered before the run ended or timed out"
        free = available_resources_per_node()
        (victim,) = [n for n in nodes if free.get(n.node_id, {}).get("CPU", 0) < 1]
        cluster.remove_node(victim, allow_graceful=False)
        assert job.is_alive(), "the run ended before its node was removed"
        job.join(timeout=max(1.0, deadline - time.monotonic()))
        assert not job.is_alive(), "the run did not finish after the node was removed"
        assert outcome.get("rc") == 0
        client = MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("faults").experiment_id])
        assert run.info.status == "FINISHED"
        resumed = int(run.data.tags.get("resumed_from_step", 0))
        assert resumed >= registered and resumed % EVERY == 0 and resumed < STEPS, (registered, run.data.tags)
        assert max(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == STEPS
        assert _checkpoints(storage)[-1].name.endswith(f"{STEPS:08d}")
    finally:
        ray.shutdown()
        cluster.shutdown()
