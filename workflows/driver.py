"""Running a planned workflow: every stage not finished runs as its own job (in order), leaves a done-marker and
reports its key numbers; one parent MLflow run (kept across reruns: found by its workdir) holds every stage's run
as a child and ends FINISHED, FAILED or KILLED with the workflow.

Progress goes through `echo` (the job prints it): library code does not print.
"""
from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage.untrusted import read_local_bounded
from tracking import params, runs, store
from workflows.config import load_config, workdir_of
from workflows.execute import StageFailed, run_job_stage
from workflows.plan import plan, to_run
from workflows.specs import SPECS
from workflows.stage import JobStage
from workflows.state import MAX_STATE_BYTES, STATE_DIR, acquire_lock, finished, marker_path, write_atomic
from workflows.summary import summary_json, summary_lines


@dataclass(frozen=True)
class Workflow:
    """A workflow config, planned: its stages in dependency order and where its runs are tracked."""

    config: dict[str, Any]
    """The workflow config, as loaded; all of it but ``mlflow`` is logged as the parent run's params."""
    config_path: str
    """The config file's path, tagged on the parent run (``workflow.config``)."""
    workdir: Path
    """The workflow's working directory, absolute: done-markers, logs, exports; a rerun finds its parent run by it."""
    stages: list[JobStage]
    """The stages in dependency order (``workflows.plan``)."""
    tracking_uri: str
    """Where the parent run and every stage's run go: the config's ``mlflow.tracking_uri``, else
    MLFLOW_TRACKING_URI, else a local store under the working directory."""
    experiment: str
    """The MLflow experiment: the config's ``mlflow.experiment``, else its ``name``, else ``workflow``."""

    @property
    def name(self) -> str:
        return self.config.get("name") or "workflow"


def load_workflow(config_path: str, workdir: str | None = None) -> Workflow:
    """The config, planned (no file written, nothing started): ValueError says what is wrong in it."""
    cfg = load_config(config_path)
    root = workdir_of(cfg, workdir)
    mlflow_cfg = cfg.get("mlflow") or {}
    return Workflow(cfg, str(config_path), root, plan(cfg, str(root)),
                    store.resolve_tracking_uri(mlflow_cfg.get("tracking_uri")),
                    mlflow_cfg.get("experiment") or cfg.get("name") or "workflow")


def stages_to_run(wf: Workflow) -> dict[str, bool]:
    """JobStage name -> whether it runs: unfinished ones (by their done-markers) and everything downstream."""
    return to_run(wf.stages, {s.name: finished(wf.workdir, s) is not None for s in wf.stages})


def _parent_run(wf: Workflow) -> runs.Run:
    """The workflow's parent run: the one of this workdir (a rerun), else a new one. Its id is also written to
    WORKDIR/_workflow/parent_run.json, for people and tools looking at a workdir (a killed run has no summary)."""
    run = runs.open_run(
        wf.tracking_uri, wf.experiment, f"workflow-{wf.name}",
        params=params.flatten_params({k: v for k, v in wf.config.items() if k != "mlflow"}),
        tags={"job": "workflow", "workflow.config": wf.config_path, "workflow.workdir": str(wf.workdir)},
        resume_by="workflow.workdir")
    write_atomic(wf.workdir / STATE_DIR / "parent_run.json",
                 json.dumps({"run_id": run.run_id, "tracking_uri": wf.tracking_uri}) + "\n")
    return run


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run_workflow(wf: Workflow, todo: dict[str, bool], echo: Callable[[str], None]) -> dict[str, Any]:
    """Run the stages `todo` marks; returns the summary (also written to WORKDIR/summary.json). StageFailed or
    KeyboardInterrupt end it, with the parent run marked FAILED or KILLED; a rerun resumes."""
    t0 = time.time()
    store.check_tracking_reachable(wf.tracking_uri)
    lock = acquire_lock(wf.workdir)
    signal.signal(signal.SIGTERM, _interrupted)  # `ray job stop`, `kill`: stop the stage, mark the runs KILLED
    try:
        parent = _parent_run(wf)
        runs.close_stale_children(parent)
        with parent.ending():
            results = _run_stages(wf, todo, parent.run_id, echo)
            parent.log_metrics({f"{s.key}.{k}": v for s in wf.stages
                                for k, v in results[s.name].get("metrics", {}).items()})
        args = (wf.name, wf.stages, results, todo, wf.workdir, wf.tracking_uri, wf.experiment, parent.run_id,
                time.time() - t0)
        for line in summary_lines(*args):
            echo(line)
        summary = summary_json(*args)
        (wf.workdir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        return summary
    finally:
        lock.release()


def _run_stages(wf: Workflow, todo: dict[str, bool], parent_run_id: str,
                echo: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    n = len(wf.stages)
    for i, s in enumerate(wf.stages, 1):
        if not todo[s.name]:
            results[s.name] = json.loads(read_local_bounded(marker_path(wf.workdir, s), MAX_STATE_BYTES,
                                                            "workflow marker"))
            echo(f"== [{i}/{n}] {s.name}: done earlier (fingerprint {s.fingerprint[:8]}), skipped")
            continue
        log_file = wf.workdir / STATE_DIR / "logs" / f"{s.key}.log"
        echo(f"== [{i}/{n}] {s.name}: running  (log: {log_file})")
        started = time.time()
        result = run_job_stage(s, s.argv_with_tracking(wf.tracking_uri, wf.experiment, parent_run_id), log_file, echo)
        if not SPECS[s.job].complete(s):
            raise StageFailed(f"stage {s.name} exited 0 but its output is incomplete: {s.outputs}")
        marker = {"stage": s.name, "fingerprint": s.fingerprint, "command": s.command(), "outputs": s.outputs,
                  "seconds": round(time.time() - started, 1), "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                  "result": result, "metrics": SPECS[s.job].metrics(result)}
        write_atomic(marker_path(wf.workdir, s), json.dumps(marker, indent=1) + "\n")
        results[s.name] = marker
        echo(f"== [{i}/{n}] {s.name}: finished in {marker['seconds']:.0f} s")
    return results
