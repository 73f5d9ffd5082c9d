"""tracking/ against a real MLflow store (sqlite), read back with MlflowClient: the experiment opens in
the model-training view, a run is resumed by its tag, params are the one flattening, runs end with the status
of what happened, and rank 0's tracker logs each (metric, step) once."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from mlflow.tracking import MlflowClient

from tracking import params, runs, store, tracker
from tracking.config import RunRef


@dataclass(frozen=True)
class Inner:
    lr: float = 1e-4
    widths: tuple[int, ...] = (16, 32)


@dataclass(frozen=True)
class Outer:
    name: str = "x"
    inner: Inner = field(default_factory=Inner)
    urls: tuple[str, ...] = tuple(f"s3://b/part-{i}" for i in range(20))
    extra: dict = field(default_factory=lambda: {"a": {"b": None}})


def test_flatten_params_one_rule():
    p = params.flatten_params(Outer(name="n" * 7000))
    assert p == {"name": "n" * params.MAX_PARAM_LENGTH, "inner.lr": "0.0001", "inner.widths": "(16, 32)",
                 "urls.count": "20", "extra.a.b": "None"}
    # Eight items are kept as they are; a ninth makes it a count.
    assert params.flatten_params({"k": list(range(8))}) == {"k": "[0, 1, 2, 3, 4, 5, 6, 7]"}
    assert params.flatten_params({"k": list(range(9))}) == {"k.count": "9"}


def test_experiment_opens_in_the_model_training_view(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    exp_id = store.get_or_create_experiment("fresh", uri)
    exp = client.get_experiment(exp_id)
    assert exp.tags[store.EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert exp.artifact_location == (tmp_path / "artifacts" / "fresh").as_uri()  # beside the store, not the cwd
    # An experiment made before the tag existed gets it the next time a job uses it; the same id comes back.
    old = client.create_experiment("older")
    assert store.EXPERIMENT_KIND_TAG not in client.get_experiment(old).tags
    assert store.get_or_create_experiment("older", uri) == old
    assert client.get_experiment(old).tags[store.EXPERIMENT_KIND_TAG] == "custom_model_development"


def test_resolve_tracking_uri_makes_sqlite_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert store.resolve_tracking_uri(None) == f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    assert store.resolve_tracking_uri("sqlite:///rel/m.db") == f"sqlite:///{tmp_path / 'rel' / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert store.resolve_tracking_uri(None) == "http://127.0.0.1:5000"
    assert store.resolve_tracking_uri("http://other:1") == "http://other:1"


def test_unreachable_server_is_refused_at_start():
    with pytest.raises(ValueError, match="unreachable"):
        store.check_tracking_reachable("http://127.0.0.1:9", timeout=2)


def test_open_run_resumes_by_tag_and_keeps_first_params(tmp_path, caplog):
    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    tags = {runs.RUN_NAME_TAG: "phase1", "job": "pretrain"}
    first = runs.open_run(uri, "exp", "phase1", params=params.flatten_params(Outer()), tags=tags,
                              resume_by=runs.RUN_NAME_TAG)
    assert not first.resumed
    first.end("KILLED")
    other = runs.open_run(uri, "exp", "phase2", tags={runs.RUN_NAME_TAG: "phase2"},
                              resume_by=runs.RUN_NAME_TAG)
    assert other.run_id != first.run_id

    again = runs.open_run(uri, "exp", "phase1", params={"inner.lr": "0.5", "new": 3}, tags=tags,
                              resume_by=runs.RUN_NAME_TAG)
    assert again.run_id == first.run_id and again.resumed
    run = client.get_run(first.run_id)
    assert run.info.status == "RUNNING" and run.info.run_name == "phase1"
    assert run.data.params["inner.lr"] == "0.0001" and run.data.params["new"] == "3"  # first values kept
    assert "changed settings" in caplog.text and "inner.lr" in caplog.text
    assert len(client.search_runs([first.experiment_id])) == 2


def test_parent_runs_and_stale_children(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    parent = runs.open_run(uri, "wf", "workflow-x", tags={"workflow.workdir": "/w"}, resume_by="workflow.workdir")
    child = runs.open_run(uri, "wf", "stage", parent_run_id=parent.run_id)
    assert client.get_run(child.run_id).data.tags[runs.PARENT_TAG] == parent.run_id
    runs.close_stale_children(parent)  # the child was left RUNNING, as by a killed stage
    assert client.get_run(child.run_id).info.status == "KILLED"
    with pytest.raises(ValueError, match="--parent-run-id 0123 is not a run"):
        runs.open_run(uri, "wf", "orphan", parent_run_id="0123")
    assert runs.run_exists(uri, parent.run_id) and not runs.run_exists(uri, "0123")


def test_run_ending_records_what_happened(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    ok = runs.open_run(uri, "e", "ok")
    with ok.ending():
        ok.log_metrics({"final_accuracy": 0.75, "nan": float("nan"), "label": "x", "flag": True}, step=0)
    assert client.get_run(ok.run_id).info.status == "FINISHED"
    logged = runs.run_metrics(uri, ok.run_id)  # numbers only; a NaN is logged as NaN, never dropped (issue 17)
    assert set(logged) == {"final_accuracy", "nan"} and logged["final_accuracy"] == 0.75 and math.isnan(logged["nan"])
    failed = runs.open_run(uri, "e", "failed")
    with pytest.raises(RuntimeError), failed.ending():
        raise RuntimeError("diverged")
    assert client.get_run(failed.run_id).info.status == "FAILED"
    killed = runs.open_run(uri, "e", "killed")
    with pytest.raises(KeyboardInterrupt), killed.ending():
        raise KeyboardInterrupt
    assert client.get_run(killed.run_id).info.status == "KILLED"


def test_tracker_logs_each_step_once_across_restarts(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    run = runs.open_run(uri, "e", "r")
    first = tracker.make_tracker(RunRef(uri, run.run_id))
    for step in (2, 4, 6):
        first.log({"loss": 10.0 - step}, step)
    first.close()
    replay = tracker.make_tracker(RunRef(uri, run.run_id))  # a restart from the checkpoint of step 4 replays step 6
    for step in (6, 8):
        replay.log({"loss": 1.0 + step}, step)
    history = MlflowClient(uri).get_metric_history(run.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(2, 8.0), (4, 6.0), (6, 4.0), (8, 9.0)]
    assert isinstance(tracker.make_tracker(None), tracker.NullTracker)
