"""An elastic run that loses a raylet: jobs/pretrain.py `--num-workers 1:3` on a `ray.cluster_utils.Cluster` of three
raylets of one CPU each (every node on 127.0.0.1), bert_tiny, tiny steps. It starts on three workers, one per raylet;
once Ray Train's controller has registered a checkpoint, one raylet is removed abruptly (its worker dies, as when a
machine goes away). Ray Train restarts the group on the two raylets left, which resume from that checkpoint, and the
run finishes in the same MLflow run: its `world_size` chart goes 3 -> 2, a `resize.step_N` tag says so, and the
digests of the examples every step trained (the checkpoints' `data_digests`, kept all) are those of the uninterrupted
order, as `python -m pretraining.batches` replays it (here for one worker: the order depends on no world size).

Not shown here: a raylet added back being used (growing); docs/scaling.md § 6 says so. Nothing depends on timing but
the removal landing before the run ends: the run is 10x longer than the step the removal waits for, and a run that
ended first fails the test (it asserts the run is still going after the removal and that it resized)."""
from __future__ import annotations

import io
import json
import re
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from _ray_checkpoints import registered_step

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS, EVERY, BATCH, SEED = 40, 4, 12, 3


def _trained_digests(run: Path) -> dict[int, str]:
    """Every step's batch digest the run's checkpoints recorded (each the steps trained since the one before; a step
    retrained after the resume overwrites the lost group's record of it)."""
    out: dict[int, str] = {}
    for state in sorted(run.glob("checkpoint-*/train_state.json")):
        out.update({int(k): v for k, v in json.loads(state.read_text())["data_digests"].items()})
    return out


def _replayed(args: list[str]) -> dict[int, str]:
    from pretraining import batches

    text = io.StringIO()
    with redirect_stdout(text):
        assert batches.main(args) == 0
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^step (\d+): ([0-9a-f]+)$", text.getvalue(), re.M)}


def test_an_elastic_run_loses_a_raylet_and_finishes_on_two_workers_in_the_same_order(ray_shutdown, tiny_pretrain_data,
                                                                                     tmp_path):
    import ray
    from mlflow.tracking import MlflowClient
    from ray.cluster_utils import Cluster

    from jobs import pretrain

    # A lost node is declared dead after 3 missed health checks a second apart (Ray's default: 5, 3 s apart): the
    # shrink waits for it, and a test need not wait 15 s.
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False,
        "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}})
    nodes = [cluster.add_node(num_cpus=1), cluster.add_node(num_cpus=1)]
    data, storage, uri = tiny_pretrain_data["train"], tmp_path / "runs", f"sqlite:///{tmp_path}/mlflow.db"
    outcome: dict = {}
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        job = threading.Thread(target=lambda: outcome.update(rc=pretrain.main([
            "--data", data, "--preset", "bert_tiny", "--max-steps", str(STEPS), "--batch-size", str(BATCH),
            "--seed", str(SEED), "--num-workers", "1:3", "--cpus-per-worker", "1", "--threads", "1", "--lr", "1e-3",
            "--warmup-steps", "2", "--storage", str(storage), "--run-name", "elastic", "--checkpoint-every",
            str(EVERY), "--keep-checkpoints", "1000", "--max-failures", "2", "--log-every", str(EVERY),
            "--mlflow-tracking-uri", uri, "--experiment", "elastic", "--no-system-metrics"])), daemon=True)
        job.start()
        deadline = time.monotonic() + 600
        while registered_step(storage) < EVERY and job.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        lost_at = registered_step(storage)
        assert lost_at >= EVERY, "no checkpoint registered before the run ended or timed out"
        cluster.remove_node(nodes[1], allow_graceful=False)  # all three raylets hold a worker: this one dies with it
        assert job.is_alive(), "the run ended before its raylet was removed"
        job.join(timeout=max(1.0, deadline - time.monotonic()))
        assert not job.is_alive(), "the run did not finish after the raylet was removed"
        assert outcome.get("rc") == 0

        client = MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("elastic").experiment_id])
        assert run.info.status == "FINISHED"
        resumed = int(run.data.tags["resumed_from_step"])
        assert lost_at <= resumed < STEPS and resumed % EVERY == 0, (lost_at, run.data.tags)
        assert run.data.tags[f"resize.step_{resumed}"].startswith(
            f"step {resumed}: 3 -> 2 workers, accumulation 1 -> 1, micro-batch 4 -> 6 (global batch {BATCH}")
        assert [k for k in run.data.tags if k.startswith("resize.")] == [f"resize.step_{resumed}"]
        # The world size charted at each (re)start and log step, in the order logged: three workers up to the resumed
        # step or past it (the lost group may have logged a step after its last registered checkpoint), then two from
        # the next log step on (a step is charted once: the retrained steps' points are not logged again).
        history = sorted(client.get_metric_history(run.info.run_id, "world_size"), key=lambda m: m.timestamp)
        sizes = [(m.step, int(m.value)) for m in history]
        first_two = next(i for i, (_, w) in enumerate(sizes) if w == 2)
        assert {w for _, w in sizes[:first_two]} == {3} and {w for _, w in sizes[first_two:]} == {2}, sizes
        assert sizes[first_two - 1][0] >= resumed and sizes[first_two][0] == sizes[first_two - 1][0] + EVERY, sizes
        assert sizes[-1] == (STEPS, 2), sizes
        assert max(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == STEPS

        # Every step trained the examples of the uninterrupted order, whatever group trained it.
        trained = _trained_digests(storage / "elastic")
        assert sorted(trained) == list(range(1, STEPS + 1))
        order = _replayed(["--data", data, "--batch-size", str(BATCH), "--seed", str(SEED), "--num-workers", "1",
                           "--steps", f"1:{STEPS}"])
        assert len(set(order.values())) == STEPS and trained == order
        logs = "".join(p.read_text(errors="replace")
                       for p in (Path(cluster.head_node.get_session_dir_path()) / "logs").glob("worker-*.err"))
        assert f"resized at step {resumed}: 3 -> 2 workers" in logs and "another data order" not in logs
    finally:
        ray.shutdown()
        cluster.shutdown()
