"""The pre-training job where MLflow is not installed (the lent GPU machine without the device bundle): the same flags
as `jobs/pretrain.py`, the same typed config (`jobs.pretrain.job_from`: manifests, memory plan, geometry), the same
launcher and loop (`training.launch.run` with `pretraining.loop.fit`, in this process: `--no-ray`), checkpoints in
`--storage`/`--run-name` and a rerun resuming from them; only the MLflow run (params, metrics, lineage, export) is
left out, so the loop's log lines are the figures (first step, throughput after warm-up).

    python benchmarks/gpu_job.py --no-ray --use-gpu --data DIR --preset bert_base --max-steps 60 --run-name r ...

`benchmarks/gpu_suite.py --call 2` runs it for its job parts when MLflow does not import, and says so in its table;
with MLflow (the bundle carried) it runs `jobs/pretrain.py` itself.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
log = logging.getLogger("gpu_job")


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    from jobs import pretrain
    from jobs._common import setup_logging
    from pretraining.loop import fit
    from training import launch as launcher

    args = pretrain.parse_args(argv)
    if not args.no_ray:
        raise SystemExit("gpu_job.py runs the loop in this process: add --no-ray")
    if args.export or args.parent_run_id or args.eval_data:
        raise SystemExit("gpu_job.py leaves out what needs MLflow or an export: drop --export, --parent-run-id and "
                         "--eval-data, or run jobs/pretrain.py with MLflow installed")
    setup_logging()
    args.run_name = args.run_name or f"gpu-job-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        job = pretrain.job_from(args)
        log.info("no MLflow run: MLflow is not installed here (benchmarks/gpu_job.py); checkpoints under %s",
                 job.launch.local_directory)
        with job.launch.writer_lease("pre-training run"), launcher.run(fit, job.config, job.launch) as final:
            print(json.dumps({"run_name": args.run_name, "checkpoint": str(final), "mlflow_run_id": None}),
                  flush=True)
    except ValueError as e:  # users' mistakes and verdicts (a KernelFault): one line, as jobs/pretrain.py ends
        log.error("%s", e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
