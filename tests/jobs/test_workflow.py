"""jobs/workflow.py end to end on tiny data, as a user runs it (a subprocess): the whole DAG runs; a rerun skips
every stage and creates no MLflow run; a changed pre-training config reruns pre-training and fine-tuning only; a
workflow SIGKILLed mid pre-training leaves no process behind and its rerun resumes and completes.

The tests share one work dir and run in file order (each builds on the previous one's state).
"""
from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample"
pytestmark = pytest.mark.slow


def tiny_config(root: Path, corpus: Path, pretrain_steps: int) -> dict:
    return {
        "name": "tiny",
        "workdir": str(root / "work"),
        "mlflow": {"experiment": "tiny"},
        "vocab": {"input": [str(corpus)], "args": {"vocab-size": 2000}},
        # --no-ray: the same build steps as a plain loop; saves a Ray start in a test about orchestration.
        "datasets": {"train": {"input": [str(corpus)],
                               "args": {"max-seq-length": 64, "dupe-factor": 1, "num-shards": 2, "no-ray": True}}},
        "pretrain": {"phase1": {"data": "train", "args": {
            "preset": "bert_tiny", "max-steps": pretrain_steps, "batch-size": 8, "checkpoint-every": 2,
            "log-every": 2, "cpus-per-worker": 1, "no-system-metrics": True}}},
        "finetune": {"rt": {"args": {
            "task": "classification", "train": str(SAMPLE / "tasks" / "rt_sentiment.jsonl.gz"),
            "split-eval-from-train": 0.1, "max-train-examples": 160, "max-eval-examples": 64, "epochs": 1,
            "batch-size": 16, "max-seq-length": 32}}},
    }


@pytest.fixture(scope="module")
def wf():
    root = Path(tempfile.mkdtemp(prefix="wf-test-"))
    corpus = root / "mobydick-chapters.jsonl"
    with gzip.open(SAMPLE / "corpus" / "mobydick.jsonl.gz", "rt") as f:
        corpus.write_text("".join(line for i, line in enumerate(f) if 1 <= i <= 8))  # a few chapters, ~90 KB
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config(root, corpus, pretrain_steps=6), sort_keys=False))
    ray_tmp = tempfile.mkdtemp(prefix="rw", dir="/tmp")  # short: Ray's Unix socket paths
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{root}/mlflow.db", RAY_TMPDIR=ray_tmp,
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_DATA_DISABLE_PROGRESS_BARS="1",
               MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING="false", TOKENIZERS_PARALLELISM="false")
    env.pop("RAY_ADDRESS", None)
    yield {"root": root, "config": config, "corpus": corpus, "env": env, "ray_tmp": ray_tmp,
           "uri": env["MLFLOW_TRACKING_URI"]}
    assert leftover_processes(ray_tmp) == [], "the workflow left Ray processes running"
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def run_workflow(wf, timeout=420) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "jobs/workflow.py", "--config", str(wf["config"])], cwd=REPO,
                         env=wf["env"], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-6000:]
    return out


def child_runs(wf) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(wf["uri"])
    exp = client.get_experiment_by_name("tiny")
    parent = json.loads((wf["root"] / "work" / "_workflow" / "parent_run.json").read_text())["run_id"]
    return client.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'")


def leftover_processes(ray_tmp: str) -> list[str]:
    """Processes (Ray's GCS, raylet, ...) whose command line names this test's Ray temp dir."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if ray_tmp in cmd:
                out.append(f"{d.name}: {cmd[:120]}")
    return out


def markers(wf) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (wf["root"] / "work" / "_workflow").glob("*.json")
            if p.name != "parent_run.json"}


def test_end_to_end(wf):
    out = run_workflow(wf)
    summary = json.loads((wf["root"] / "work" / "summary.json").read_text())
    stages = summary["stages"]
    assert list(stages) == ["vocab", "dataset train", "pretrain phase1", "finetune rt"]
    assert all(s["ran"] for s in stages.values())
    # Each product is there, in the format its consumer reads.
    vocab = Path(stages["vocab"]["outputs"]["vocab"]).read_text().splitlines()
    assert 500 < len(vocab) <= 2000 and vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    dataset = Path(stages["dataset train"]["outputs"]["dataset"])
    manifest = json.loads((dataset / "manifest.json").read_text())
    assert len(manifest["shards"]) == 2 and manifest["totals"]["instances"] > 0
    assert (dataset / "vocab.txt").read_text().splitlines() == vocab
    export = Path(stages["pretrain phase1"]["outputs"]["export"])
    assert {"config.json", "model.safetensors", "vocab.txt", "bert_pretrain_run.json"} <= {p.name for p in
                                                                                           export.iterdir()}
    assert "loss" in stages["pretrain phase1"]["metrics"]
    assert "accuracy" in stages["finetune rt"]["result"]
    assert (Path(stages["finetune rt"]["outputs"]["model"]) / "config.json").is_file()
    # One parent run holding the three MLflow-tracked stages as children; the parent carries the key metrics.
    from mlflow.tracking import MlflowClient

    kids = child_runs(wf)
    assert sorted(r.data.tags.get("job", r.info.run_name) for r in kids) == ["build_dataset", "finetune", "pretrain"]
    assert all(r.info.status == "FINISHED" for r in kids)
    parent = MlflowClient(wf["uri"]).get_run(summary["mlflow"]["parent_run_id"])
    assert parent.info.status == "FINISHED" and "pretrain.phase1.loss" in parent.data.metrics
    assert "mlflow ui --backend-store-uri" in out.stdout


def test_rerun_skips_everything(wf):
    before_markers, before_runs = markers(wf), {r.info.run_id for r in child_runs(wf)}
    out = run_workflow(wf)
    assert "4 stages, 0 to run" in out.stdout
    assert out.stdout.count("skipped") >= 4
    assert markers(wf) == before_markers
    assert {r.info.run_id for r in child_runs(wf)} == before_runs


def test_changed_config_killed_midway_then_rerun_completes(wf):
    """More pre-training steps: pre-training and fine-tuning rerun (vocab and dataset do not). The workflow is
    SIGKILLed once pre-training has written a checkpoint; the rerun resumes that run and finishes."""
    root = wf["root"]
    cfg = tiny_config(root, wf["corpus"], pretrain_steps=40)
    wf["config"].write_text(yaml.safe_dump(cfg, sort_keys=False))
    runs_before = {r.info.run_id for r in child_runs(wf)}
    dry = subprocess.run([sys.executable, "jobs/workflow.py", "--config", str(wf["config"]), "--dry-run"],
                         cwd=REPO, env=wf["env"], capture_output=True, text=True, timeout=120)
    plan = {line.split("]")[1].split("  ")[0].strip(): line for line in dry.stdout.splitlines() if "] " in line}
    assert [k for k, v in plan.items() if " run " in v] == ["pretrain phase1", "finetune rt"], dry.stdout

    proc = subprocess.Popen([sys.executable, "jobs/workflow.py", "--config", str(wf["config"])], cwd=REPO,
                            env=wf["env"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    checkpoints = root / "work" / "checkpoints"
    deadline = time.time() + 300
    try:
        while not any(checkpoints.glob("tiny-phase1-*/checkpoint_*")):
            assert proc.poll() is None, "the workflow ended before pre-training wrote a checkpoint"
            assert time.time() < deadline, "no checkpoint within 300 s"
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.time() + 60
    while leftover_processes(wf["ray_tmp"]) and time.time() < deadline:
        time.sleep(1)
    assert leftover_processes(wf["ray_tmp"]) == []
    killed = [r for r in child_runs(wf) if r.info.run_id not in runs_before]
    assert [r.data.tags.get("job") for r in killed] == ["pretrain"]

    out = run_workflow(wf)
    assert "dataset train: done earlier" in out.stdout and "vocab: done earlier" in out.stdout
    assert "resuming MLflow run" in out.stdout  # pre-training continued its run (and checkpoint)
    new = [r for r in child_runs(wf) if r.info.run_id not in runs_before]
    assert sorted(r.data.tags.get("job") for r in new) == ["finetune", "pretrain"]  # the same pretrain run
    assert all(r.info.status == "FINISHED" for r in new)
    from mlflow.tracking import MlflowClient

    pretrain = next(r for r in new if r.data.tags.get("job") == "pretrain")
    steps = [m.step for m in MlflowClient(wf["uri"]).get_metric_history(pretrain.info.run_id, "loss")]
    assert max(steps) == 40
