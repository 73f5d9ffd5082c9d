"""The whole pipeline as one workflow: [train vocab] -> build dataset(s) -> pre-train phase(s) -> fine-tune task(s).

    python jobs/workflow.py --config configs/quickstart.yaml [--workdir DIR] [--dry-run]
    ray job submit --working-dir . -- python jobs/workflow.py --config configs/gpu-cluster.yaml --workdir /shared/dir

Each stage is its stand-alone job run as `python jobs/<job>.py ...` in a subprocess: the same code and flags as
`ray job submit -- python jobs/<job>.py`, every stage with a fresh Ray driver and MLflow client (no state leaks
from one stage's `ray.init`/active run into the next; a stage that crashes or is OOM-killed cannot take the
workflow's bookkeeping with it), and under `ray job submit` each stage joins the same cluster through the
inherited RAY_ADDRESS. The price is a Ray start per stage on a laptop (seconds).

A finished stage leaves a done-marker (WORKDIR/_workflow/<stage>.json) holding its fingerprint; on a rerun a stage
whose marker matches and whose output is complete is skipped, an interrupted one is rerun and resumes (see
jobs/_workflow_plan.py), a changed one reruns with everything downstream. One parent MLflow run (kept across
reruns) holds every stage's run as a child. The end prints the key metrics, where everything is, and how to open
the MLflow UI.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jobs import _common
from jobs._workflow_plan import Stage, load_config, plan, with_tracking
from training import tracking

log = logging.getLogger("workflow")
JOBS_DIR = Path(__file__).resolve().parent
STATE_DIR = "_workflow"
# Ray gives a new local node 30 s (hard-coded) to come up; a loaded machine can miss it. Such a stage failed
# before doing anything and is retried (the jobs are idempotent); any other failure stops the workflow.
TRANSIENT = ("The current node timed out during startup",)
RETRIES = 2
# The metrics worth a line at the end (and on the parent run), per job, when the stage reports them.
KEY_METRICS = {
    "pretrain": ("loss", "mlm_accuracy", "nsp_accuracy", "eval_loss", "eval_mlm_accuracy", "eval_nsp_accuracy",
                 "sequences_per_second", "mfu"),
    "build_dataset": ("instances", "documents", "tokens", "shards"),
    "train_tokenizer": ("vocab_size",),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="workflow", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="workflow YAML (configs/quickstart.yaml, configs/gpu-cluster.yaml)")
    p.add_argument("--workdir", help="where stage outputs and done-markers go (default: the config's `workdir`)")
    p.add_argument("--dry-run", action="store_true", help="print each stage's command and whether it would run")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


# ---- checks before any work ------------------------------------------------------------------------------------

def check_flags(stages: list[Stage]) -> None:
    """Every stage's command line through its job's own parser, before the first stage starts an hour of work."""
    import importlib
    import contextlib
    import io

    for s in stages:
        mod = importlib.import_module(f"jobs.{s.job}")
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                mod.parse_args(with_tracking(s, "sqlite:///x.db", "x", "0" * 32))
        except SystemExit:
            raise ValueError(f"stage {s.name}: jobs/{s.job}.py rejects its flags: {err.getvalue().strip()}") from None


# ---- done-markers --------------------------------------------------------------------------------------------

def marker_path(workdir: Path, stage: Stage) -> Path:
    return workdir / STATE_DIR / f"{stage.key}.json"


def write_atomic(path: Path, text: str) -> None:
    """A marker is either absent or whole, whenever the workflow is killed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def output_complete(stage: Stage) -> bool:
    """The stage's product is all there (each job writes its completion evidence last)."""
    from pipeline import storage

    if stage.job == "train_tokenizer":
        return storage.exists(stage.outputs["vocab"])
    if stage.job == "build_dataset":
        return storage.exists(storage.join(stage.outputs["dataset"], "manifest.json"))
    if stage.job == "pretrain":
        export = Path(stage.outputs["export"])
        return all((export / f).is_file() for f in ("config.json", "model.safetensors", "bert_pretrain_run.json"))
    if stage.job == "finetune":
        return (Path(stage.outputs["model"]) / "config.json").is_file()
    raise AssertionError(stage.job)


def finished(workdir: Path, stage: Stage) -> dict[str, Any] | None:
    """The stage's done-marker when it matches the stage's fingerprint and the output is complete, else None."""
    path = marker_path(workdir, stage)
    if not path.is_file():
        return None
    try:
        marker = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    if marker.get("fingerprint") != stage.fingerprint or not output_complete(stage):
        return None
    return marker


# ---- running one stage ---------------------------------------------------------------------------------------

def _die_with_parent() -> None:
    """Linux: the stage gets SIGTERM if the workflow dies (even by SIGKILL), so no orphan keeps a cluster busy."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def run_stage(stage: Stage, argv: list[str], log_file: Path) -> dict[str, Any]:
    """Run the job (again, after a transient start-up failure); return its last JSON line."""
    for attempt in range(RETRIES + 1):
        rc, last_json, transient = _run_once(stage, argv, log_file)
        if rc == 0:
            return last_json
        if not transient or attempt == RETRIES:
            break
        print(f"== {stage.name}: Ray did not start in time (a busy machine?); retrying ({attempt + 1}/{RETRIES})",
              flush=True)
    raise RuntimeError(f"stage {stage.name} failed (exit {rc}); its full log: {log_file}\n"
                       f"  rerun the workflow to resume, or run the stage alone:\n  {stage.command()}")


def _run_once(stage: Stage, argv: list[str], log_file: Path) -> tuple[int, dict[str, Any], bool]:
    """Run the job, stream its output (prefixed) to our stdout and to its log."""
    cmd = [sys.executable, "-u", str(JOBS_DIR / f"{stage.job}.py"), *argv]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    last_json: dict[str, Any] = {}
    transient = False
    with open(log_file, "a", buffering=1) as lf:  # line-buffered: `tail -f` the log while it runs
        lf.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {stage.command()}\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                env=env, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        try:
            for line in proc.stdout:
                lf.write(line)
                sys.stdout.write(f"  {stage.key} | {line}")
                s = line.strip()
                transient = transient or any(t in s for t in TRANSIENT)
                if s.startswith("{") and s.endswith("}"):
                    try:
                        last_json = json.loads(s)
                    except json.JSONDecodeError:
                        pass
            rc = proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    return rc, last_json, transient


# ---- MLflow ----------------------------------------------------------------------------------------------------

def parent_run(workdir: Path, tracking_uri: str, experiment: str, cfg: dict, config_path: str) -> tracking.Run:
    """The workflow's parent run: the one of this workdir (a rerun), else a new one. Its id is also written to
    WORKDIR/_workflow/parent_run.json, for people and tools looking at a workdir (a killed run has no summary)."""
    name = cfg.get("name") or "workflow"
    run = tracking.open_run(
        tracking_uri, experiment, f"workflow-{name}",
        params=tracking.flatten_params({k: v for k, v in cfg.items() if k != "mlflow"}),
        tags={"job": "workflow", "workflow.config": config_path, "workflow.workdir": str(workdir)},
        resume_by="workflow.workdir")
    path = workdir / STATE_DIR / "parent_run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"run_id": run.run_id, "tracking_uri": tracking_uri}) + "\n")
    return run


def stage_metrics(stage: Stage, result: dict[str, Any], tracking_uri: str) -> dict[str, float]:
    """The key numbers of a finished stage: from its final JSON line, or (pre-training) its MLflow run."""
    if stage.job == "pretrain":
        lineage = Path(stage.outputs["export"]) / "bert_pretrain_run.json"
        try:
            run_id = json.loads(lineage.read_text())["mlflow_run_id"]
            metrics = tracking.run_metrics(tracking_uri, run_id)
            return {k: metrics[k] for k in KEY_METRICS["pretrain"] if k in metrics}
        except Exception as e:  # a summary must not fail a finished workflow
            log.warning("could not read %s's metrics: %s", stage.name, e)
            return {}
    wanted = KEY_METRICS.get(stage.job)
    return {k: float(v) for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and (wanted is None or k in wanted)}


# ---- the workflow ----------------------------------------------------------------------------------------------

def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def acquire_lock(workdir: Path) -> Path:
    lock = workdir / STATE_DIR / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    if lock.is_file():
        pid = int(lock.read_text().strip() or 0)
        try:
            if pid and pid != os.getpid():
                os.kill(pid, 0)
                raise ValueError(f"another workflow (pid {pid}) is running on {workdir}; wait for it or stop it")
        except ProcessLookupError:
            pass  # a killed run's lock
    lock.write_text(f"{os.getpid()}\n")
    return lock


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _common.setup_logging(args.log_level)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # progress must show up in `ray job logs` / a redirect as it happens
    t0 = time.time()
    try:
        cfg = load_config(args.config)
        workdir_arg = args.workdir or cfg.get("workdir") or f"runs/{cfg.get('name') or 'workflow'}"
        if "://" in workdir_arg:
            raise ValueError(f"workdir {workdir_arg}: must be a local or shared-filesystem path (exports and "
                             "done-markers live there); put datasets on object storage with `output_root`")
        workdir = Path(workdir_arg).resolve()
        stages = plan(cfg, str(workdir))
        check_flags(stages)
        mcfg = cfg.get("mlflow") or {}
        experiment = mcfg.get("experiment") or cfg.get("name") or "workflow"
        tracking_uri = tracking.resolve_tracking_uri(mcfg.get("tracking_uri"))
        if os.environ.get("RAY_ADDRESS") and not Path(workdir_arg).is_absolute():
            log.warning("running on a Ray cluster with a relative workdir: outputs go under this job's temporary "
                        "working dir %s; pass --workdir /absolute/shared/path to keep them", workdir)
    except ValueError as e:
        print(f"workflow: error: {e}", file=sys.stderr)
        return 2

    todo = {s.name: finished(workdir, s) is None for s in stages}
    # Anything downstream of a stage that runs must run too (its inputs are about to be (re)made).
    for s in stages:
        if any(todo.get(d) for d in s.deps):
            todo[s.name] = True
    print(f"== workflow {cfg.get('name')!r}: {len(stages)} stages, {sum(todo.values())} to run, workdir {workdir}")
    for i, s in enumerate(stages, 1):
        print(f"  [{i}/{len(stages)}] {s.name:<24} {'run ' if todo[s.name] else 'done'}  {s.command()}")
    if args.dry_run:
        return 0

    try:
        tracking.check_tracking_reachable(tracking_uri)
    except ValueError as e:
        print(f"workflow: error: {e}", file=sys.stderr)
        return 2
    try:
        lock = acquire_lock(workdir)
    except ValueError as e:
        print(f"workflow: error: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupted)  # `ray job stop`, `kill`: stop the stage, mark the runs KILLED
    parent = parent_run(workdir, tracking_uri, experiment, cfg, str(args.config))
    tracking.close_stale_children(parent)
    results: dict[str, dict[str, Any]] = {}
    try:
        for i, s in enumerate(stages, 1):
            if not todo[s.name]:
                marker = json.loads(marker_path(workdir, s).read_text())
                results[s.name] = marker
                print(f"== [{i}/{len(stages)}] {s.name}: done earlier (fingerprint {s.fingerprint[:8]}), skipped")
                continue
            print(f"== [{i}/{len(stages)}] {s.name}: running  (log: {workdir / STATE_DIR / 'logs' / s.key}.log)")
            started = time.time()
            result = run_stage(s, with_tracking(s, tracking_uri, experiment, parent.run_id),
                               workdir / STATE_DIR / "logs" / f"{s.key}.log")
            if not output_complete(s):
                raise RuntimeError(f"stage {s.name} exited 0 but its output is incomplete: {s.outputs}")
            marker = {"stage": s.name, "fingerprint": s.fingerprint, "command": s.command(), "outputs": s.outputs,
                      "seconds": round(time.time() - started, 1), "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                      "result": result, "metrics": stage_metrics(s, result, tracking_uri)}
            write_atomic(marker_path(workdir, s), json.dumps(marker, indent=1) + "\n")
            results[s.name] = marker
            print(f"== [{i}/{len(stages)}] {s.name}: finished in {marker['seconds']:.0f} s")
    except BaseException as e:
        parent.end("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        lock.unlink(missing_ok=True)
        if isinstance(e, RuntimeError):
            print(f"workflow: error: {e}", file=sys.stderr)
            return 1
        if isinstance(e, KeyboardInterrupt):
            print(f"workflow: interrupted ({e or 'Ctrl-C'}); rerun the same command to resume", file=sys.stderr)
            return 130
        raise
    summary = summarise(cfg, stages, results, workdir, tracking_uri, experiment, parent.run_id, time.time() - t0,
                        todo)
    parent.log_metrics({f"{s.key}.{k}": v for s in stages for k, v in results[s.name].get("metrics", {}).items()})
    parent.end("FINISHED")
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lock.unlink(missing_ok=True)
    return 0


def _fmt(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:.4g}"


def summarise(cfg, stages, results, workdir, tracking_uri, experiment, parent, seconds, todo) -> dict[str, Any]:
    ran = sum(todo.values())
    print(f"\n== workflow {cfg.get('name')!r} done in {seconds / 60:.1f} min ({ran} stages ran, "
          f"{len(stages) - ran} skipped as already done)")
    for s in stages:
        m = results[s.name].get("metrics", {})
        nums = "  ".join(f"{k} {_fmt(v)}" for k, v in m.items())
        where = "  ".join(f"{k}: {v}" for k, v in s.outputs.items())
        if s.job == "build_dataset":
            where += f"  (shards: {s.outputs['dataset']}/shards)"
        print(f"  {s.name:<24} {where}")
        if nums:
            print(f"  {'':<24} {nums}")
    print(f"\nMLflow: parent run {parent} (experiment {experiment!r}) holds every stage as a child run; store "
          f"{tracking_uri}")
    if tracking_uri.startswith(("http://", "https://")):
        print(f"  open {tracking_uri}  to compare the runs")
    else:
        print(f"  open the UI:  mlflow ui --backend-store-uri {tracking_uri} --port 5000   then http://127.0.0.1:5000")
    print(f"  done-markers and stage logs: {workdir / STATE_DIR}; this summary: {workdir / 'summary.json'}")
    return {"name": cfg.get("name"), "workdir": str(workdir), "mlflow": {"tracking_uri": tracking_uri,
            "experiment": experiment, "parent_run_id": parent}, "seconds": round(seconds, 1),
            "stages": {s.name: {"ran": todo[s.name], "outputs": s.outputs, "fingerprint": s.fingerprint,
                                "metrics": results[s.name].get("metrics", {}),
                                "result": results[s.name].get("result", {})} for s in stages}}


if __name__ == "__main__":
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    sys.exit(main())
