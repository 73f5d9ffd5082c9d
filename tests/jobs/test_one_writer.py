"""One writer per output, end to end (storage/lease.py through the jobs): two dataset builds with different configs
started 3 s apart on one --output, on local disk and on a real S3-protocol server (moto on loopback): the second
refuses in one line naming the first, and the first completes with its own config and row counts; two pre-training
jobs on one --storage/--run-name: the second refuses before it opens an MLflow run, and after the first is killed
with SIGKILL the same command run again 5 s later takes over at once (the record names a process on this host that
has exited) and resumes into the first's run from its last committed checkpoint."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage import fs as storage_fs
from storage.lease import OUTPUT_LEASE, STALE_ENV
from storage.lease_store import store_for

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample"
pytestmark = pytest.mark.timeout(600)


def _build_flags(output: str, dupe: int, endpoint: str | None) -> list[str]:
    flags = ["--input", str(SAMPLE / "corpus" / "mobydick.jsonl.gz"), "--output", output,
             "--vocab", str(SAMPLE / "reference" / "bert-base-uncased-vocab.txt"), "--no-ray",
             "--max-seq-length", "64", "--max-predictions-per-seq", "10", "--dupe-factor", str(dupe),
             "--num-shards", "2", "--log-level", "WARNING"]
    return flags + (["--endpoint-url", endpoint] if endpoint else [])


def _wait_for(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_two_builds_on_one_output(where, tmp_path, request):
    endpoint = None
    if where == "s3":
        endpoint, bucket = request.getfixturevalue("s3_bucket")
        out, reference = f"s3://{bucket}/ds", f"s3://{bucket}/reference"
    else:
        out, reference = str(tmp_path / "ds"), str(tmp_path / "reference")
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    started = time.time()
    # The first build (dupe factor 3), its one instances step held 10 s: it is busy when the second starts.
    first = subprocess.Popen([sys.executable, str(REPO / "tests" / "jobs" / "_slow_build.py"), "10",
                              *_build_flags(out, 3, endpoint)],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(max(0.0, started + 3 - time.time()))
        assert first.poll() is None, "the first build ended before the second started: " + first.stderr.read()
        second = subprocess.run([sys.executable, "-m", "jobs.build_dataset", *_build_flags(out, 2, endpoint)],
                                cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr
        line = second.stderr.strip()
        assert "\n" not in line, line
        assert line.startswith(f"build_dataset: error: {out} is being written by another dataset build (host "), line
        assert f"pid {first.pid} (_slow_build.py)" in line and "started 20" in line and "use another --output" in line
        assert first.poll() is None, "the second build was refused only after the first had finished"
        stdout, stderr = first.communicate(timeout=400)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr
    assert json.loads(stdout.strip().splitlines()[-1])["output"] == out
    # The first build's dataset is its own: its config and rows are those of the same build made alone.
    alone = subprocess.run([sys.executable, "-m", "jobs.build_dataset", *_build_flags(reference, 3, endpoint)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr
    built = storage_fs.read_json(storage_fs.join(out, "manifest.json"), endpoint)
    expected = storage_fs.read_json(storage_fs.join(reference, "manifest.json"), endpoint)
    assert built["config"]["dupe_factor"] == 3 and built["config_hash"] == expected["config_hash"]
    assert built["totals"] == expected["totals"] and built["shards"] == expected["shards"]
    for shard in built["shards"]:
        assert storage_fs.read_bytes(storage_fs.join(out, shard["file"]), endpoint) == \
            storage_fs.read_bytes(storage_fs.join(reference, shard["file"]), endpoint)
    assert store_for(storage_fs.join(out, OUTPUT_LEASE), endpoint).read()[0]["token"] is None  # released at the end
    assert not storage_fs.exists(storage_fs.join(out, "_work"), endpoint)


def test_two_pretraining_jobs_on_one_run_name(tiny_pretrain_data, tmp_path, monkeypatch, caplog):
    from mlflow.tracking import MlflowClient

    from jobs import pretrain

    # The stated time, shortened for the test (the first job inherits it), yet long enough that the live first job's
    # heartbeats (every 10/4 s) never look stale on a loaded machine.
    monkeypatch.setenv(STALE_ENV, "10")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    runs = tmp_path / "runs"

    def flags(seed: int) -> list[str]:
        return ["--data", tiny_pretrain_data["train"], "--preset", "bert_tiny", "--max-steps", "200", "--batch-size",
                "8", "--threads", "1", "--lr", "1e-3", "--storage", str(runs), "--run-name", "shared",
                "--checkpoint-every", "20", "--keep-checkpoints", "2", "--log-every", "20", "--no-ray",
                "--mlflow-tracking-uri", uri, "--experiment", "one-writer", "--no-system-metrics", "--seed",
                str(seed)]

    log = open(tmp_path / "first.log", "w")  # a file, not a pipe: an unread pipe fills and blocks the job
    first = subprocess.Popen([sys.executable, "-m", "jobs.pretrain", *flags(1)], cwd=REPO, stdout=log, stderr=log)
    try:
        _wait_for(lambda: (runs / "shared" / "checkpoint-00000020").is_dir() or first.poll() is not None,
                  "the first job's first checkpoint", timeout=240)
        assert first.poll() is None, (tmp_path / "first.log").read_text()
        caplog.clear()
        assert pretrain.main(flags(2)) == 2
        (line,) = [r.getMessage() for r in caplog.records if r.name == "jobs.pretrain" and r.levelname == "ERROR"]
        assert "\n" not in line and line.startswith(f"{runs / 'shared'} is being written by another pre-training run")
        assert f"pid {first.pid} (pretrain.py)" in line and "give this job another --run-name" in line
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name("one-writer").experiment_id
        (run,) = client.search_runs([experiment])  # the second job opened no run and wrote into none
        assert run.data.params["seed"] == "1"

        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    time.sleep(5)  # check 4-resume: the same command, 5 s after the kill (well inside the stale time)
    caplog.set_level("INFO")
    with caplog.at_level("WARNING", logger="storage.lease"):
        assert pretrain.main(flags(1)) == 0  # takes over at once and resumes
    assert any("took over from host" in r.getMessage() and f"pid {first.pid} " in r.getMessage()
               and "has exited" in r.getMessage() for r in caplog.records)
    assert any("resumed from" in r.getMessage() for r in caplog.records), "the rerun started over"
    (again,) = client.search_runs([experiment])
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    assert again.data.params["seed"] == "1"
    assert int(again.data.tags["resumed_from_step"]) >= 20
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert steps == list(range(20, 201, 20)), steps  # one job's steps, each once
    for checkpoint in sorted((runs / "shared").glob("checkpoint-*")):
        state = json.loads((checkpoint / "train_state.json").read_text())
        assert state["mlflow_run_id"] == run.info.run_id and state["config"]["runtime"]["seed"] == 1
    assert store_for(str(runs / "shared.lease.json")).read()[0]["token"] is None  # released


def test_a_stalled_build_commits_nothing_after_a_takeover(tmp_path, monkeypatch):
    """Issue 30: a build (the plain loop) is SIGSTOPped while it writes its instances, past the lease's stale time; the
    same command takes the output over and finishes. Woken, the stalled build commits no item into the finished
    output (every marker is proved under the lease first) and exits 2 with one line naming the build that took over."""
    monkeypatch.setenv(STALE_ENV, "4")
    out = tmp_path / "ds"
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    stalled = subprocess.Popen([sys.executable, str(REPO / "tests" / "jobs" / "_slow_build.py"), "3",
                                *_build_flags(str(out), 2, None)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (out / "_work" / "pool").is_dir() or stalled.poll() is not None, "the build's pool stage")
        time.sleep(1)  # inside its first (held) instances unit
        stalled.send_signal(signal.SIGSTOP)
        time.sleep(6)
        taker = subprocess.run([sys.executable, "-m", "jobs.build_dataset", *_build_flags(str(out), 2, None)],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert taker.returncode == 0, taker.stderr
        assert "took over from host" in taker.stderr
        finished = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
        stalled.send_signal(signal.SIGCONT)
        _, err = stalled.communicate(timeout=60)
    finally:
        if stalled.poll() is None:
            stalled.send_signal(signal.SIGCONT)
            stalled.kill()
    assert stalled.returncode == 2, err
    (line,) = [x for x in err.splitlines() if " ERROR " in x]
    assert "lost its writer lease to dataset build on host" in line and "pid " in line, line
    assert not list(out.rglob("*.done.json")), "the stalled build committed an item after the takeover"
    assert json.loads((out / "manifest.json").read_text())["totals"]["instances"] > 0
    after = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert [p for p in after if p not in finished and not p.startswith("_work/")] == []
