"""Elastic runs on real Ray.

- jobs/pretrain.py `--num-workers 1:3` on a `ray.cluster_utils.Cluster` of three raylets of one CPU each (every node
  on 127.0.0.1), bert_tiny, tiny steps. It starts on three workers, one per raylet; once Ray Train's controller has
  registered a checkpoint, one raylet is removed abruptly (its worker dies, as when a machine goes away). Ray Train
  restarts the group on the two raylets left, which resume from that checkpoint; once the run says so (its
  `resize.step_N` tag), a raylet is added back, and within `--resize-check-seconds` the group is restarted on three
  again. The run finishes in the same MLflow run: its `world_size` chart goes 3 -> 2 -> 3, a `resize.step_N` tag says
  each resize, and the digests of the examples every step trained (the checkpoints' `data_digests`, kept all) are
  those of the uninterrupted order, as `python -m pretraining.batches` replays it (for one worker: the order depends
  on no world size).
- A run stopped by its time budget on one process (`--no-ray`) and resumed by the same command on two Ray workers
  trains the examples of the uninterrupted order at every step, in the same MLflow run, without the "another data
  order" warning.

Nothing depends on timing but the resizes landing before the run ends: the test asserts the run is still going after
the removal and after the raylet is added back, and that it resized both ways."""
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

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

STEPS, EVERY, BATCH, SEED = 100, 4, 12, 3  # long enough that the two-worker group is still going when a raylet returns


def _trained_digests(run: Path) -> dict[int, str]:
    """Every step's batch digest the run's checkpoints recorded (each the steps trained since the one before; a step
    retrained after the resume overwrites the lost group's record of it)."""
    out: dict[int, str] = {}
    for state in sorted(run.glob("checkpoint-*/train_state.json")):
        out.update({int(k): v for k, v in json.loads(state.read_text())["data_digests"].items()})
    return out


def _worker_logs(session_dir: str) -> str:
    """What the train workers logged (stderr of every Ray worker of the session): their resize and order lines."""
    return "".join(p.read_text(errors="replace") for p in (Path(session_dir) / "logs").glob("worker-*.err"))


def _replayed(args: list[str]) -> dict[int, str]:
    from pretraining import batches

    text = io.StringIO()
    with redirect_stdout(text):
        assert batches.main(args) == 0
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^step (\d+): ([0-9a-f]+)$", text.getvalue(), re.M)}


def test_an_elastic_run_shrinks_when_a_raylet_is_lost_and_grows_when_one_returns(ray_shutdown, tiny_pretrain_data,
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
            "--resize-check-seconds", "2", "--mlflow-tracking-uri", uri, "--experiment", "elastic",
            "--no-system-metrics"])), daemon=True)
        job.start()
        deadline = time.monotonic() + 900  # 150 s alone on an idle 2-core box, 290 s beside two other test processes
        while registered_step(storage) < EVERY and job.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        lost_at = registered_step(storage)
        assert lost_at >= EVERY, "no checkpoint registered before the run ended or timed out"
        cluster.remove_node(nodes[1], allow_graceful=False)  # all three raylets hold a worker: this one dies with it
        assert job.is_alive(), "the run ended before its raylet was removed"
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name("elastic").experiment_id

        def resizes() -> dict[int, str]:
            (run,) = client.search_runs([experiment])
            return {int(k.split("_")[1]): v for k, v in run.data.tags.items() if k.startswith("resize.step_")}

        while not resizes() and job.is_alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert job.is_alive() and resizes(), "the run did not restart on fewer workers while it was going"
        (shrunk,) = resizes()
        while registered_step(storage) <= shrunk and job.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)  # a checkpoint of the two workers' own: the grow resumes from a later step than the shrink
        cluster.add_node(num_cpus=1)  # a node returns: the next resize check finds room for a third worker
        job.join(timeout=max(1.0, deadline - time.monotonic()))
        assert not job.is_alive(), "the run did not finish"
        assert outcome.get("rc") == 0

        (run,) = client.search_runs([experiment])
        assert run.info.status == "FINISHED"
        (shrunk, grown) = sorted(resizes())
        assert lost_at <= shrunk < grown < STEPS and shrunk % EVERY == 0 == grown % EVERY, (lost_at, run.data.tags)
        assert int(run.data.tags["resumed_from_step"]) == grown
        assert resizes()[shrunk].startswith(
            f"step {shrunk}: 3 -> 2 workers, accumulation 1 -> 1, micro-batch 4 -> 6 (global batch {BATCH}")
        assert resizes()[grown].startswith(
            f"step {grown}: 2 -> 3 workers, accumulation 1 -> 1, micro-batch 6 -> 4 (global batch {BATCH}")
        # The world size charted at each (re)start and log step, in the order logged: 3, then 2, then 3 again (a step
        # is charted once: the retrained steps' points are not logged again); the run ends on three.
        history = sorted(client.get_metric_history(run.info.run_id, "world_size"), key=lambda m: m.timestamp)
        sizes = [(m.step, int(m.value)) for m in history]
        runs_of = [w for i, (_, w) in enumerate(sizes) if i == 0 or w != sizes[i - 1][1]]
        assert runs_of == [3, 2, 3] and sizes[-1] == (STEPS, 3), sizes
        assert max(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == STEPS

        # Every step trained the examples of the uninterrupted order, whatever group trained it.
        trained = _trained_digests(storage / "elastic")
        assert sorted(trained) == list(range(1, STEPS + 1))
        order = _replayed(["--data", data, "--batch-size", str(BATCH), "--seed", str(SEED), "--num-workers", "1",
                           "--steps", f"1:{STEPS}"])
        assert len(set(order.values())) == STEPS and trained == order
        logs = _worker_logs(cluster.head_node.get_session_dir_path())
        assert f"resized at step {shrunk}: 3 -> 2 workers" in logs and "another data order" not in logs
        assert f"resized at step {grown}: 2 -> 3 workers" in logs
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_a_run_stopped_on_one_process_resumes_on_two_workers_on_the_same_examples(ray_shutdown, tiny_pretrain_data,
                                                                                tmp_path):
    """The job-level resume on another worker count: `--no-ray` stops at its first step on a --max-minutes budget
    (checked every step: a checkpoint and an export of step 1); the same command on two Ray workers resumes it from
    there, in the same MLflow run, and every step trained the uninterrupted order's examples."""
    import ray
    from mlflow.tracking import MlflowClient

    from jobs import pretrain

    data, storage, uri = tiny_pretrain_data["train"], tmp_path / "runs", f"sqlite:///{tmp_path}/mlflow.db"
    steps = 12

    def flags(*extra: str) -> list[str]:
        return ["--data", data, "--preset", "bert_tiny", "--max-steps", str(steps), "--batch-size", str(BATCH),
                "--seed", str(SEED), "--threads", "1", "--lr", "1e-3", "--warmup-steps", "2", "--storage",
                str(storage), "--run-name", "moved", "--checkpoint-every", str(EVERY), "--keep-checkpoints", "1000",
                "--log-every", str(EVERY), "--mlflow-tracking-uri", uri, "--experiment", "moved",
                "--no-system-metrics", *extra]

    assert pretrain.main(flags("--no-ray", "--max-minutes", "0.0001")) == 0
    stopped = 1  # the budget is checked at every step: the first step is past 0.006 s
    assert sorted(_trained_digests(storage / "moved")) == list(range(1, stopped + 1))
    # address="local": a new Ray of its own, never one another pytest process started on this machine
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    assert pretrain.main(flags("--num-workers", "2", "--cpus-per-worker", "1")) == 0
    logs = _worker_logs(ray._private.worker._global_node.get_session_dir_path())
    assert f"resized at step {stopped}: 1 -> 2 workers" in logs and "another data order" not in logs
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("moved").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["resumed_from_step"] == str(stopped)
    assert run.data.tags[f"resize.step_{stopped}"].startswith(f"step {stopped}: 1 -> 2 workers"), run.data.tags
    assert max(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == steps
    trained = _trained_digests(storage / "moved")
    order = _replayed(["--data", data, "--batch-size", str(BATCH), "--seed", str(SEED), "--num-workers", "3",
                       "--steps", f"1:{steps}"])
    assert sorted(trained) == list(range(1, steps + 1)) and trained == order
