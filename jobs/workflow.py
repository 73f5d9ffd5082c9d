"""The whole pipeline as one workflow: [train vocab] -> build dataset(s) -> pre-train phase(s) -> fine-tune task(s).

    python jobs/workflow.py --config configs/quickstart.yaml [--workdir DIR] [--dry-run]
    ray job submit --working-dir . -- python jobs/workflow.py --config configs/gpu-cluster.yaml --workdir /shared/dir

Each stage is its stand-alone job run as `python jobs/<job>.py ...` in a subprocess: the same code and flags as
`ray job submit -- python jobs/<job>.py`. A finished stage leaves a done-marker (WORKDIR/_workflow/<stage>.json)
holding its fingerprint; on a rerun a stage whose marker matches and whose output is complete is skipped, an
interrupted one is rerun and resumes, a changed one reruns with everything downstream (see workflows/plan.py).
One parent MLflow run (kept across reruns) holds every stage's run as a child. The end prints the key metrics,
where everything is, and how to open the MLflow UI.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import os
import sys
from pathlib import Path

if __name__ == "__main__":  # `python jobs/X.py` from any shell: find the project; outside its venv, say how in one line
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from jobs._preflight import require_project_env

    require_project_env(__file__)

from jobs._common import HelpFormatter, refuse_secrets, setup_logging
from storage.redact import redact_text
from workflows.driver import Workflow, load_workflow, run_workflow, stages_to_run
from workflows.execute import StageFailed

log = logging.getLogger("workflow")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="workflow", description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter,
                                fromfile_prefix_chars="@")
    p.add_argument("--config", required=True, help="workflow YAML (configs/quickstart.yaml, configs/gpu-cluster.yaml)")
    p.add_argument("--workdir", help="where stage outputs and done-markers go (default: the config's `workdir`)")
    p.add_argument("--dry-run", action="store_true", help="print each stage's command and whether it would run")
    p.add_argument("--log-level", default="INFO")
    refuse_secrets(p, argv)
    return p.parse_args(argv)


def check_flags(wf: Workflow) -> None:
    """Every stage's command line through its job's own parser, before the first stage starts an hour of work."""
    for s in wf.stages:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                importlib.import_module(f"jobs.{s.job}").parse_args(s.argv_with_tracking("sqlite:///x.db", "x", "0"))
        except SystemExit:
            raise ValueError(f"stage {s.name}: jobs/{s.job}.py rejects its flags: {err.getvalue().strip()}") from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_level)
    if hasattr(sys.stdout, "reconfigure"):
        # Progress must show up in `ray job logs` / a redirect as it happens.
        sys.stdout.reconfigure(line_buffering=True)
    try:
        wf = load_workflow(args.config, args.workdir)
        check_flags(wf)
    except ValueError as e:
        print(f"workflow: error: {redact_text(str(e))}", file=sys.stderr)
        return 2
    if os.environ.get("RAY_ADDRESS") and not Path(args.workdir or wf.config.get("workdir") or "x").is_absolute():
        log.warning("running on a Ray cluster with a relative workdir: outputs go under this job's temporary working "
                    "dir %s; pass --workdir /absolute/shared/path to keep them", wf.workdir)
    todo = stages_to_run(wf)
    print(f"== workflow {wf.config.get('name')!r}: {len(wf.stages)} stages, {sum(todo.values())} to run, "
          f"workdir {wf.workdir}")
    for i, s in enumerate(wf.stages, 1):
        print(f"  [{i}/{len(wf.stages)}] {s.name:<24} {'run ' if todo[s.name] else 'done'}  {redact_text(s.command())}")
    if args.dry_run:
        return 0
    try:
        run_workflow(wf, todo, echo=print)
    except ValueError as e:  # an unreachable tracking server, another workflow on the workdir
        print(f"workflow: error: {redact_text(str(e))}", file=sys.stderr)
        return 2
    except StageFailed as e:
        print(f"workflow: error: {redact_text(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(f"workflow: interrupted ({e or 'Ctrl-C'}); rerun the same command to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
