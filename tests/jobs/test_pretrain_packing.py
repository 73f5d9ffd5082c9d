"""jobs/pretrain.py --packing (--no-ray): the flags reach the trainer's config, the run trains on packed rows and
its checkpoint keeps the packed stream position."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(300)


def test_packing_flags_reach_the_run(tiny_pretrain_data, tmp_path):
    from mlflow.tracking import MlflowClient

    from jobs import pretrain

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert pretrain.main([
        "--data", tiny_pretrain_data["train"], "--preset", "bert_tiny", "--max-steps", "2", "--batch-size", "4",
        "--packing", "--pack-sequences", "2", "--threads", "1", "--storage", str(tmp_path / "runs"), "--run-name",
        "packed", "--checkpoint-every", "2", "--log-every", "1", "--no-ray", "--mlflow-tracking-uri", uri,
        "--experiment", "pk", "--no-system-metrics"]) == 0
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("pk").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["data.packing"] == "True" and run.data.params["data.pack_sequences"] == "2"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2]
    state = json.loads((tmp_path / "runs" / "packed" / "checkpoint-00000002" / "train_state.json").read_text())
    assert state["data_position"]["packed_position"] == [0, 2]  # window 0, two global batches taken
