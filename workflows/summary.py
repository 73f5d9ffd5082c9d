"""The end of a workflow: what ran, the key numbers of every stage, where everything is, how to open MLflow; as
lines for the console and as WORKDIR/summary.json."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tracking.links import experiment_url, ui_base, ui_command
from tracking.store import experiment_id
from workflows.stage import JobStage
from workflows.state import STATE_DIR


def _fmt(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:.4g}"


def summary_lines(name: str, stages: list[JobStage], results: dict[str, dict[str, Any]], todo: dict[str, bool],
                  workdir: Path, tracking_uri: str, experiment: str, parent_run_id: str, seconds: float) -> list[str]:
    ran = sum(todo.values())
    lines = [f"\n== workflow {name!r} done in {seconds / 60:.1f} min ({ran} stages ran, "
             f"{len(stages) - ran} skipped as already done)"]
    for s in stages:
        where = "  ".join(f"{k}: {v}" for k, v in s.outputs.items())
        if s.job == "build_dataset":
            where += f"  (shards: {s.outputs['dataset']}/shards)"
        lines.append(f"  {s.name:<24} {where}")
        nums = "  ".join(f"{k} {_fmt(v)}" for k, v in results[s.name].get("metrics", {}).items())
        if nums:
            lines.append(f"  {'':<24} {nums}")
        result = results[s.name].get("result", {})
        # What the numbers alone hide: a budget that ended the stage early, a model that learnt nothing.
        if result.get("stopped"):
            lines.append(f"  {'':<24} STOPPED EARLY: by {result['stopped']} (the model is trained that far only)")
        if result.get("slowed"):  # the machine, not the run, is why it took long: the same steps, later
            lines.append(f"  {'':<24} SLOW: {result['slowed']}")
        if result.get("collapse"):
            lines.append(f"  {'':<24} WARNING: {result['collapse']}")
    lines.append(f"\nMLflow: parent run {parent_run_id} (experiment {experiment!r}) holds every stage as a child run; "
                 f"store {tracking_uri}")
    exp_id = experiment_id(tracking_uri, experiment)
    url = experiment_url(tracking_uri, exp_id) if exp_id is not None else ui_base(tracking_uri)
    command = ui_command(tracking_uri)
    if command:
        lines.append(f"  open the UI:  {command}   then {url}")
    else:
        lines.append(f"  open {url}  to compare the runs")
    lines.append(f"  done-markers and stage logs: {workdir / STATE_DIR}; this summary: {workdir / 'summary.json'}")
    return lines


def summary_json(name: str, stages: list[JobStage], results: dict[str, dict[str, Any]], todo: dict[str, bool],
                 workdir: Path, tracking_uri: str, experiment: str, parent_run_id: str,
                 seconds: float) -> dict[str, Any]:
    return {"name": name, "workdir": str(workdir),
            "mlflow": {"tracking_uri": tracking_uri, "experiment": experiment, "parent_run_id": parent_run_id},
            "seconds": round(seconds, 1),
            "stages": {s.name: {"ran": todo[s.name], "outputs": s.outputs, "fingerprint": s.fingerprint,
                                "metrics": results[s.name].get("metrics", {}),
                                "result": results[s.name].get("result", {})} for s in stages}}
