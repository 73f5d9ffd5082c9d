"""The stalled-driver scenario of issue 30 (item 1), runnable alone: job 1 pre-trains bert_tiny on Ray (one worker,
seed 1); once it has checkpointed, its driver is SIGSTOPped (a suspended laptop driving a cluster, a paused VM);
after the lease's stale time job 2 (same --storage/--run-name, seed 2) starts and takes the run over; job 1's driver
is then woken (SIGCONT).

What must hold (printed as one JSON object, `ok` true when all do):
- no seed-1 checkpoint is written after job 2 took over (by the files' times, one clock: this host's disk);
- job 2 resumes from a checkpoint job 1 wrote before job 2 took over, trains to the end and exits 0;
- job 1 exits non-zero, its last error line names the job that took over (host and pid);
- the MLflow run's loss points after the takeover are job 2's (each step once), and it stays FINISHED when job 1
  wakes;
- job 2's command run again (with --export) says the run is complete and exits 0 (item 8, on Ray).

    python tests/jobs/fenced_scenario.py WORKDIR [--stale 8]

Runs ~3 minutes on a 2-core box. tests/jobs/test_fenced_writers.py runs it.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MOBY = REPO / "data" / "sample" / "corpus" / "mobydick.jsonl.gz"


def _data(work: Path) -> str:
    """A tiny dataset (seq 64, a 600-entry vocab, 2 shards) built by the real builder, once per work folder."""
    out = work / "data"
    if not (out / "manifest.json").is_file():
        rc = subprocess.run([sys.executable, "-m", "jobs.build_dataset", "--input", str(MOBY), "--output", str(out),
                             "--vocab-size", "600", "--dupe-factor", "1", "--max-seq-length", "64",
                             "--max-predictions-per-seq", "10", "--num-shards", "2", "--no-ray", "--log-level",
                             "WARNING"], cwd=REPO, capture_output=True, text=True, timeout=600)
        if rc.returncode:
            raise SystemExit(f"building the dataset failed: {rc.stderr[-2000:]}")
    return str(out)


def _flags(data: str, work: Path, seed: int, steps: int) -> list[str]:
    return ["--data", data, "--preset", "bert_tiny", "--max-steps", str(steps), "--batch-size", "8", "--lr", "1e-3",
            "--num-workers", "1", "--cpus-per-worker", "1", "--threads", "1", "--storage", str(work / "runs"),
            "--run-name", "shared", "--checkpoint-every", "20", "--keep-checkpoints", "50", "--log-every", "20",
            "--mlflow-tracking-uri", f"sqlite:///{work}/mlflow.db", "--experiment", "fenced", "--no-system-metrics",
            "--seed", str(seed), "--max-failures", "0"]


def _checkpoints(run: Path) -> list[dict]:
    """Every checkpoint folder of the run: its step, the seed of the job that wrote it, its files' latest time."""
    found = []
    for d in sorted(run.glob("checkpoint-*")):
        state = d / "train_state.json"
        if not state.is_file():
            continue
        try:
            meta = json.loads(state.read_text())
        except json.JSONDecodeError:  # being copied in by Ray Train's upload right now: seen at the next look
            continue
        written = max(p.stat().st_mtime for p in d.rglob("*") if p.is_file())
        found.append({"name": d.name, "step": int(meta["step"]), "seed": int(meta["seed"]), "written": written})
    return found


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def scenario(work: Path, stale: float) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    data = _data(work)
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "BERT_LEASE_STALE_SECONDS": str(stale),
           "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    run = work / "runs" / "shared"
    log1, log2 = open(work / "job1.log", "w"), open(work / "job2.log", "w")
    # Job 1 runs long enough to be still training, un-fenced, well after job 2 took over.
    job1 = subprocess.Popen([sys.executable, "-m", "jobs.pretrain", *_flags(data, work, 1, 4000)], cwd=REPO, env=env,
                            stdout=log1, stderr=subprocess.STDOUT)
    job2 = None
    try:
        _wait(lambda: any(c["seed"] == 1 for c in _checkpoints(run)) or job1.poll() is not None, 400,
              "job 1's first checkpoint")
        if job1.poll() is not None:
            raise SystemExit("job 1 ended before its driver was stopped:\n" + (work / "job1.log").read_text()[-3000:])
        job1.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        time.sleep(stale + 2)
        started2 = time.time()
        # Job 2 trains well past where job 1 had got: it has to write checkpoints of its own.
        steps2 = max(c["step"] for c in _checkpoints(run)) + 200
        job2 = subprocess.Popen([sys.executable, "-m", "jobs.pretrain", *_flags(data, work, 2, steps2)], cwd=REPO,
                                env=env, stdout=log2, stderr=subprocess.STDOUT)
        rc2 = job2.wait(timeout=600)
        job1.send_signal(signal.SIGCONT)
        try:
            rc1 = job1.wait(timeout=120)
        except subprocess.TimeoutExpired:
            rc1 = None
    finally:
        for p in (job1, job2):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()
        log1.close()
        log2.close()
    text1, text2 = (work / "job1.log").read_text(), (work / "job2.log").read_text()
    checkpoints = _checkpoints(run)
    seed2 = [c for c in checkpoints if c["seed"] == 2]
    first_seed2 = min((c["written"] for c in seed2), default=None)
    # Job 2 cannot have taken over before it started: any seed-1 checkpoint written after that is job 1 writing
    # into a run it no longer held (or about to be taken over).
    late = [c for c in checkpoints if c["seed"] == 1 and c["written"] > started2]
    resumed = [line for line in text2.splitlines() if "resumed from" in line]
    errors1 = [line for line in text1.splitlines() if " ERROR " in line]
    verdict = {
        "stale_seconds": stale, "driver_stopped_after_s": round(started2 - stopped_at, 1),
        "job1_exit": rc1, "job2_exit": rc2, "job2_pid": job2.pid,
        "seed1_checkpoints_after_takeover": [(c["name"], round(c["written"] - started2, 1)) for c in late],
        "seed2_checkpoints": [c["name"] for c in seed2],
        "job2_resumed": resumed[-1][-160:] if resumed else None,
        "job1_last_error": errors1[-1][-300:] if errors1 else None,
        "first_seed2_checkpoint_after_start_s": round(first_seed2 - started2, 1) if first_seed2 else None,
    }
    verdict["ok"] = bool(not late and rc2 == 0 and rc1 not in (0, None) and seed2 and errors1
                         and "lost its writer lease to" in errors1[-1] and f"pid {job2.pid} " in errors1[-1])
    verdict["mlflow"] = _mlflow_points(work)
    rerun = subprocess.run([sys.executable, "-m", "jobs.pretrain", *_flags(data, work, 2, steps2), "--export",
                            str(work / "export")], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    verdict["rerun_exit"] = rerun.returncode
    verdict["rerun_complete"] = "is already complete" in rerun.stderr
    verdict["ok"] = (verdict["ok"] and verdict["mlflow"]["each_step_once"] and verdict["mlflow"]["status"] == "FINISHED"
                     and rerun.returncode == 0
                     and verdict["rerun_complete"] and (work / "export" / "config.json").is_file())
    return verdict


def _mlflow_points(work: Path) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{work}/mlflow.db")
    experiment = client.get_experiment_by_name("fenced").experiment_id
    runs = client.search_runs([experiment])
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "loss")] if runs else []
    # Job 1, woken after job 2 finished, must not have ended the run job 2 finished (FAILED, KILLED).
    return {"runs": len(runs), "loss_steps": steps, "status": runs[0].info.status if runs else None,
            "each_step_once": len(runs) == 1 and len(steps) == len(set(steps))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--stale", type=float, default=8.0, help="BERT_LEASE_STALE_SECONDS for both jobs")
    args = parser.parse_args()
    verdict = scenario(args.workdir.resolve(), args.stale)
    print(json.dumps(verdict, indent=1))
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
