"""The build's MLflow run, read back from a real store: named after its output, readable params (the inputs as a
list, the real vocabulary size), the report's figures, the dataset as the run's output, the vocabulary stage's own
child run, and a run that spans the build."""
from __future__ import annotations

import gzip
import json

from corpus.schema import read_manifest
from jobs import build_dataset
from tracking.build_report import FIGURES

PNG = b"\x89PNG\r\n\x1a\n"


def corpus(tmp_path, sample_dir, name: str, first: int, last: int) -> str:
    with gzip.open(sample_dir / "corpus" / "mobydick.jsonl.gz", "rt", encoding="utf-8") as f:
        lines = [line for line in f if line.strip()][first:last]
    path = tmp_path / name
    path.write_text("".join(lines))
    return str(path)


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_a_build_with_a_trained_vocabulary_logs_a_report_a_dataset_and_a_vocabulary_run(tmp_path, sample_dir,
                                                                                        mlflow_uri, capsys):
    from mlflow.tracking import MlflowClient

    a, b = corpus(tmp_path, sample_dir, "a.jsonl", 1, 4), corpus(tmp_path, sample_dir, "b.jsonl", 4, 6)
    out = tmp_path / "moby-64"
    assert build_dataset.main(["--input", a, "--input", b, "--output", str(out), "--vocab-size", "800",
                               "--max-seq-length", "64", "--max-predictions-per-seq", "10", "--dupe-factor", "2",
                               "--num-shards", "2", "--no-ray", "--mlflow-tracking-uri", mlflow_uri,
                               "--experiment", "builds"]) == 0
    run_id = last_json(capsys.readouterr().out)["mlflow_run_id"]
    manifest = json.loads((out / "manifest.json").read_text())
    client = MlflowClient(mlflow_uri)
    run = client.get_run(run_id)

    assert run.info.run_name == "build moby-64 seq64" and run.info.status == "FINISHED"
    assert run.data.tags["job"] == "build_dataset"  # what the workflow finds its stages' runs by
    p = run.data.params
    assert p["inputs"] == f"{a}, {b}"
    assert p["vocab"] == "trained on the input" and p["vocab.asked_size"] == "800"
    assert p["vocab.size"] == str(manifest["vocab"]["size"]) and int(p["vocab.size"]) <= 800
    assert p["instances.max_seq_length"] == "64" and p["dupe_factor"] == "2" and p["input_files"] == "2"
    m = run.data.metrics
    assert m["instances"] == manifest["totals"]["instances"] > 0 and m["unk_fraction"] == 0.0
    assert 0.3 < m["random_next_fraction"] < 0.7
    assert {f"stage_seconds.{s}" for s in ("vocab", "read", "instances", "shards")} <= m.keys()
    assert f"{manifest['totals']['instances']:,} sequences" in run.data.tags["mlflow.note.content"]

    report = [f.path for f in client.list_artifacts(run_id, "report")]
    assert report == sorted(f"report/{name}" for name in FIGURES)
    for path in report:
        assert open(client.download_artifacts(run_id, path, str(tmp_path)), "rb").read(8) == PNG

    [inp] = run.inputs.dataset_inputs
    assert inp.dataset.name == "moby-64" and inp.dataset.digest == read_manifest(str(out)).sha256[:16]
    assert {t.key: t.value for t in inp.tags}["mlflow.data.context"] == "output"

    [vocab_run] = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
    assert vocab_run.info.run_name == "vocab moby-64" and vocab_run.info.status == "FINISHED"
    assert vocab_run.data.metrics["vocab_size"] == manifest["vocab"]["size"]
    assert vocab_run.data.params["vocab_size"] == "800"
    vocab = open(client.download_artifacts(vocab_run.info.run_id, "vocab.txt", str(tmp_path / "v"))).read()
    assert vocab == (out / "vocab.txt").read_text()
    # The build's run spans its stages: opened at the job's start, closed at the build's end.
    assert run.info.start_time <= vocab_run.info.start_time <= vocab_run.info.end_time <= run.info.end_time
    assert run.info.end_time - run.info.start_time >= 1000 * sum(v for k, v in m.items()
                                                                   if k.startswith("stage_seconds.")) - 50


def test_a_given_vocabulary_is_logged_with_its_real_size_and_two_builds_read_apart(tmp_path, sample_dir,
                                                                                   mlflow_uri, capsys):
    from mlflow.tracking import MlflowClient

    vocab = str(sample_dir / "reference" / "bert-base-uncased-vocab.txt")
    common = ["--vocab", vocab, "--dupe-factor", "1", "--num-shards", "1", "--no-ray", "--mlflow-tracking-uri",
              mlflow_uri, "--experiment", "builds"]
    ids = {}
    for name, first, last in (("train", 1, 4), ("eval", 4, 5)):
        assert build_dataset.main(["--input", corpus(tmp_path, sample_dir, f"{name}.jsonl", first, last),
                                   "--output", str(tmp_path / name), *common]) == 0
        ids[name] = last_json(capsys.readouterr().out)["mlflow_run_id"]
    client = MlflowClient(mlflow_uri)
    runs = {k: client.get_run(v) for k, v in ids.items()}
    assert {k: r.info.run_name for k, r in runs.items()} == {"train": "build train seq128", "eval": "build eval seq128"}
    for r in runs.values():
        assert r.data.params["vocab"] == vocab and r.data.params["vocab.size"] == "30522"
        assert "vocab.asked_size" not in r.data.params
        assert "stage_seconds.vocab" not in r.data.metrics  # no vocabulary stage, so no child run either
        assert not client.search_runs([r.info.experiment_id], f"tags.mlflow.parentRunId = '{r.info.run_id}'")


def test_the_summary_is_printed_once_the_dataset_is_committed_not_after_the_reports_figures(
        tmp_path, sample_dir, mlflow_uri, capsys, monkeypatch):
    """The report's figures (matplotlib, the slowest part of the run's end) are drawn after the dataset is committed
    and its summary printed: what reads the job's output goes on while they are; the job still returns only once
    the run holds them."""
    import threading

    from mlflow.tracking import MlflowClient

    import tracking.build_report as report

    drawing, go_on = threading.Event(), threading.Event()
    real = report.figures

    def held_figures(*a):  # the real figures, drawn only once the test has seen the summary
        drawing.set()
        assert go_on.wait(120)
        return real(*a)

    monkeypatch.setattr(report, "figures", held_figures)
    out = tmp_path / "early"
    done: list[int] = []
    job = threading.Thread(target=lambda: done.append(build_dataset.main([
        "--input", corpus(tmp_path, sample_dir, "e.jsonl", 1, 3), "--output", str(out), "--no-ray",
        "--vocab", str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), "--dupe-factor", "1",
        "--num-shards", "1", "--mlflow-tracking-uri", mlflow_uri, "--experiment", "builds"])))
    job.start()
    try:
        assert drawing.wait(120)
        summary = last_json(capsys.readouterr().out)  # printed while the figures are still held
        assert (out / "manifest.json").exists() and summary["instances"] == read_manifest(str(out)).totals.instances
        assert job.is_alive()  # main() returns once the run is written
    finally:
        go_on.set()
        job.join(120)
    assert done == [0]
    client = MlflowClient(mlflow_uri)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert sorted(f.path for f in client.list_artifacts(run.info.run_id, "report")) == sorted(
        f"report/{name}" for name in FIGURES)


def test_a_failed_build_leaves_a_failed_run_saying_why(tmp_path, sample_dir, mlflow_uri):
    from mlflow.tracking import MlflowClient

    zh = str(sample_dir / "other" / "vimtutor.zh_cn.txt.gz")
    vocab = str(sample_dir / "reference" / "bert-base-uncased-vocab.txt")
    try:
        build_dataset.main(["--input", zh, "--output", str(tmp_path / "zh"), "--vocab", vocab, "--no-ray",
                            "--mlflow-tracking-uri", mlflow_uri, "--experiment", "builds"])
    except ValueError as e:
        error = str(e)
    else:
        raise AssertionError("a 40% [UNK] build must stop")
    client = MlflowClient(mlflow_uri)
    [run] = client.search_runs([client.get_experiment_by_name("builds").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["error"] == error
    assert run.info.run_name == "build zh seq128"


def test_on_ray_the_run_hears_every_stage_and_the_callers_ray_stays_up(ray_shutdown, ray_tmpdir, tmp_path, sample_dir,
                                                                       mlflow_uri, capsys):
    import ray
    from mlflow.tracking import MlflowClient

    ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=ray_tmpdir, log_to_driver=False)
    out = tmp_path / "moby-ray"
    assert build_dataset.main(["--input", corpus(tmp_path, sample_dir, "m.jsonl", 1, 5), "--output", str(out),
                               "--vocab", str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"),
                               "--dupe-factor", "1", "--num-shards", "2", "--mlflow-tracking-uri", mlflow_uri,
                               "--experiment", "builds", "--progress", "lines"]) == 0
    run = MlflowClient(mlflow_uri).get_run(last_json(capsys.readouterr().out)["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.params["executor"] == "ray data"
    assert {f"stage_seconds.{s}" for s in ("read", "pool", "instances", "shards")} <= run.data.metrics.keys()
    # Per operator of the row passes, counted on Ray's workers (Ray Data fuses each pass into one task per unit).
    m = run.data.metrics
    docs = read_manifest(str(out)).totals.documents
    assert m["op.read.SplitTokenize.rows_in"] == m["op.read.ReadCorpus.rows_out"] > docs  # documents + report rows
    assert m["op.instances.ReadDocs.rows_out"] >= docs and m["op.instances.CountPairs.rows_out"] >= docs
    assert m["op.read.SplitTokenize.cpu_s"] > 0 and m["op.instances.ReadDocs.mb_out"] > 0
    assert run.inputs.dataset_inputs[0].dataset.digest == read_manifest(str(out)).sha256[:16]
    assert ray.is_initialized()  # the job leaves a Ray it did not start


def test_a_build_without_a_tracking_uri_logs_to_the_store_the_other_jobs_use(tmp_path, sample_dir, capsys,
                                                                              monkeypatch):
    """No flag, no MLFLOW_TRACKING_URI: ./mlruns/mlflow.db under the working directory, as pre-training and
    fine-tuning do (tracking.store.resolve_tracking_uri), so the pre-training's Datasets column names a build that
    has a run."""
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert build_dataset.main(["--input", corpus(tmp_path, sample_dir, "a.jsonl", 0, 10), "--output",
                               str(tmp_path / "ds"), "--vocab", str(sample_dir / "reference" /
                                                                   "bert-base-uncased-vocab.txt"),
                               "--max-seq-length", "64", "--dupe-factor", "1", "--num-shards", "1", "--no-ray"]) == 0
    run_id = last_json(capsys.readouterr().out)["mlflow_run_id"]
    store = tmp_path / "mlruns" / "mlflow.db"
    assert store.is_file()
    assert MlflowClient(f"sqlite:///{store}").get_run(run_id).info.status == "FINISHED"


def test_a_killed_builds_run_is_marked_killed_by_the_next_build_of_its_output(tmp_path, sample_dir):
    """SIGKILL leaves a build's run RUNNING (nothing of the job is left to end it); the next build of the same output
    takes the output's lease over and marks that run KILLED, saying why, before it opens its own."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from mlflow.tracking import MlflowClient

    repo = Path(__file__).resolve().parents[2]
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "BERT_LEASE_STALE_SECONDS": "3"}
    flags = ["--input", corpus(tmp_path, sample_dir, "m.jsonl", 1, 4), "--output", str(tmp_path / "ds"), "--vocab",
             str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), "--no-ray", "--dupe-factor", "1",
             "--num-shards", "1", "--experiment", "builds", "--log-level", "WARNING"]
    client = MlflowClient(uri)
    client.search_experiments()  # the store's tables made now: two processes creating one sqlite store race in MLflow
    first = subprocess.Popen([sys.executable, str(repo / "tests" / "jobs" / "_slow_build.py"), "60", *flags],
                             cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def opened() -> list:
        exp = client.get_experiment_by_name("builds")
        return client.search_runs([exp.experiment_id]) if exp else []

    try:
        deadline = time.time() + 120
        while not opened():  # the run opens as the work begins; each unit's instances then wait 60 s
            assert first.poll() is None and time.time() < deadline, first.stderr.read().decode()
            time.sleep(0.5)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    [killed] = opened()
    assert killed.info.status == "RUNNING"  # what a dead job leaves
    time.sleep(4)  # the dead holder's lease goes stale (3 s after its last heartbeat)

    second = subprocess.run([sys.executable, str(repo / "jobs" / "build_dataset.py"), *flags], cwd=repo, env=env,
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    after = client.get_run(killed.info.run_id)
    new_id = last_json(second.stdout)["mlflow_run_id"]
    assert after.info.status == "KILLED" and after.info.end_time is not None
    assert after.data.tags["error"].startswith("the job ended without closing this run") and new_id in \
        after.data.tags["error"]
    assert f"MLflow run {killed.info.run_id} was left RUNNING by a job that died: marked KILLED" in second.stderr
    assert client.get_run(new_id).info.status == "FINISHED"
