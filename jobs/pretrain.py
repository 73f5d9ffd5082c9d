"""Pre-train BERT (MLM + NSP) from the shards of `jobs/build_dataset.py` on Ray Train, tracked in one MLflow run.

    python jobs/pretrain.py --data DATASET_URL [--eval-data URL] --preset bert_tiny --max-steps 1000 \
        --batch-size 256 [--micro-batch-size 64] [--num-workers 2 --cpus-per-worker 1 | --use-gpu] \
        [--storage ./runs --run-name NAME --checkpoint-every 200] [--init CHECKPOINT] [--export DIR_OR_URL]
    ray job submit --working-dir . -- python jobs/pretrain.py ...          # the same flags, on a cluster

Flags -> `pretraining.config.PretrainConfig` (checked against the dataset; the micro-batch planned for the
workers' memory) -> `pretraining.pretrain_job.run_pretraining` (`training.job.run_job`'s steps); the last line on
stdout is a JSON summary. Checkpoints go to STORAGE/RUN_NAME; the same command again resumes from the last one into
the same MLflow run. docs/architecture.md says how the data order, the guard, the memory plan and the launch work.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # `python jobs/X.py` from any shell: find the project; outside its venv, say how in one line
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from jobs._preflight import require_project_env

    require_project_env(__file__)

from cluster import interrupt
from corpus.schema import read_manifest
from jobs import _eval_flags
from jobs._common import (
    HelpFormatter,
    comma_ints,
    finite,
    refuse_bad_names,
    refuse_secrets,
    run_main,
    setup_logging,
    workers,
)
from jobs._fields import add_field
from pretraining import kernel_options
from pretraining.config import CheckpointConfig, OptimizerConfig, PretrainConfig, RuntimeConfig
from pretraining.loader import DataConfig
from pretraining.memory import MemoryConfig, plan_for_workers
from pretraining.pretrain_job import PretrainJob, model_config, run_pretraining
from storage.redact import redact
from tracking.config import TrackingConfig
from tracking.store import resolve_tracking_uri
from training.defaults import WARMUP_FRACTION, lr_or_default, warmup_or_default
from training.launch import LaunchConfig

log = logging.getLogger("jobs.pretrain")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pretrain", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter, fromfile_prefix_chars="@")
    d = p.add_argument_group("data")
    d.add_argument("--data", required=True, help="dataset directory written by jobs/build_dataset.py (local/s3://)")
    d.add_argument("--endpoint-url", help="S3-compatible endpoint for s3:// data and storage (MinIO, Ceph, ...)")
    add_field(d, "--length-bucketing", DataConfig, action=argparse.BooleanOptionalAction)
    d.add_argument("--length-buckets", type=comma_ints, help="comma-separated widths batches are padded to, e.g. "
                   "32,64,96,128 (default: multiples of the dataset's max_seq_length / 4)")
    add_field(d, "--dynamic-masking", DataConfig)
    add_field(d, "--packing", DataConfig, help_suffix="The rows are max_seq_length wide; --batch-size and "
              "--micro-batch-size then count packed rows.")
    add_field(d, "--pack-sequences", DataConfig, type=int, help_suffix="Used with --packing.")
    m = p.add_argument_group("model and optimisation")
    m.add_argument("--preset", default="bert_base", help="bert_tiny|bert_mini|bert_small|bert_medium|bert_base|...")
    m.add_argument("--init", help="start from an export, a checkpoint directory or any HF BERT directory: a local "
                   "path or a URL (s3://, gs://; fetched into STORAGE/.init-cache, or ./.init-cache)")
    m.add_argument("--max-steps", type=int, required=True,
                   help="optimizer steps; the job states the run's estimated length after its first steps: on CPU, "
                        "a bert_base step takes minutes, a bert_tiny one well under a second")
    # 256, not DataConfig.batch_size's 0 (one worker's micro-batch x accumulation): the job plans the micro-batch
    # from a global batch, by default the paper's for bert_base.
    m.add_argument("--batch-size", type=int, default=256,
                   help="GLOBAL sequences per optimizer step. The default --lr values hold at 32 (bert_tiny, "
                        "measured) and 256 (bert_base, the paper's); far from those, scale --lr with about the "
                        "square root of the batch")
    m.add_argument("--micro-batch-size", type=int, help="sequences per forward per worker (default: as many as "
                   "fit in memory, up to all of them; gradient accumulation keeps --batch-size)")
    add_field(m, "--optimizer", OptimizerConfig, "name", choices=("adamw", "lamb"))
    # --lr and --warmup-steps default to None, not to their fields' values: the job chooses them (job_from).
    m.add_argument("--lr", type=finite(above=0),
                   help="peak learning rate. Default: chosen for the model's width (--preset "
                   "or --init), 2e-3 for bert_tiny (H=128) down to 1e-4 for bert_base (H=768) (training/defaults.py, "
                   "docs/learning-rates.md); the value used is logged. An MLM accuracy stuck at the most frequent "
                   "token's share says: higher; a divergence: lower (the job names a value)")
    m.add_argument("--warmup-steps", type=int,
                   help=f"steps over which the rate ramps up from 0. Default: {100 * WARMUP_FRACTION:.0f}%% of "
                        "--max-steps; 0 turns it off (a small model at a high rate without warm-up stalls or diverges "
                        "early)")
    add_field(m, "--weight-decay", OptimizerConfig, type=finite(minimum=0))
    add_field(m, "--decay", OptimizerConfig, choices=("linear", "poly"))
    add_field(m, "--poly-power", OptimizerConfig, type=finite(above=0))
    add_field(m, "--max-grad-norm", OptimizerConfig, type=finite(minimum=0))
    add_field(m, "--compile", RuntimeConfig, action=argparse.BooleanOptionalAction,
              help_suffix="Not given: on with --use-gpu, off without.")
    add_field(m, "--compile-backend", RuntimeConfig)
    add_field(m, "--compile-cache", RuntimeConfig, metavar="DIR",
              help_suffix="Give one (local or a shared volume) that only you and your jobs can write; nothing "
                          "compiled is ever read from --storage.")
    add_field(m, "--cuda-graphs", RuntimeConfig)
    m.add_argument("--fused-kernels", choices=tuple(kernel_options.FUSED_KERNELS), default="auto",
                   help=kernel_options.FUSED_KERNELS_HELP)
    m.add_argument("--low-precision-residual", action="store_true", help=kernel_options.LOW_PRECISION_RESIDUAL_HELP)
    add_field(m, "--seed", RuntimeConfig, type=int)
    r = p.add_argument_group("resources")
    add_field(r, "--num-workers", LaunchConfig, type=workers, help_suffix="MIN:MAX makes the run elastic: it shrinks "
              "when a node is lost and grows when one returns, in the same data order (docs/scaling.md).")
    add_field(r, "--resize-check-seconds", LaunchConfig, type=finite(above=0))
    add_field(r, "--use-gpu", LaunchConfig, help_suffix="Pre-training then runs under bf16 autocast.")
    # 1, not LaunchConfig.cpus_per_worker's None (the cluster's CPUs / workers): the torch threads follow from it
    # (job_from).
    r.add_argument("--cpus-per-worker", type=finite(above=0), default=1.0,
                   help="Ray CPUs per worker; fractions are fine (the data thread needs no Ray slot)")
    r.add_argument("--threads", type=int, help="torch threads per CPU worker (default: round(cpus-per-worker))")
    r.add_argument("--memory-gb", type=finite(above=0),
                   help="memory per worker to size the micro-batch for (default: the "
                   "free RAM of this machine shared by its workers, or the GPU's free memory at the worker's start)")
    r.add_argument("--peak-tflops", type=finite(above=0),
                   help="accelerator peak for mfu (default: known GPUs' bf16 peak)")
    add_field(r, "--no-ray", LaunchConfig, help_suffix="It runs pretraining.loop.fit; STORAGE/RUN_NAME must be local.")
    c = p.add_argument_group("checkpoints and tracking")
    add_field(c, "--storage", LaunchConfig, help_suffix="Checkpoints go to STORAGE/RUN_NAME.")
    c.add_argument("--run-name", help="names the checkpoint folder and MLflow run; rerun with it to resume")
    add_field(c, "--checkpoint-every", CheckpointConfig, "every", type=int)
    add_field(c, "--keep-checkpoints", LaunchConfig, type=int)
    add_field(c, "--max-failures", LaunchConfig, type=int)
    c.add_argument("--export", help="write the final model here in the Hugging Face layout (a local directory or a "
                   "URL such as s3://bucket/models/name)")
    c.add_argument("--mlflow-tracking-uri")
    add_field(c, "--experiment", PretrainJob)
    c.add_argument("--parent-run-id", help="log this run as a child of that MLflow run")
    add_field(c, "--log-every", TrackingConfig, type=int)
    c.add_argument("--max-minutes", type=finite(above=0),
                   help="wall-clock budget of the training loop: stop (with a final "
                   "eval, checkpoint and export) at the first step after it; the lr schedule still spans --max-steps. "
                   "Without it a run is bounded by --max-steps alone: the same model however busy the machine")
    c.add_argument("--no-system-metrics", action="store_true", help="do not sample CPU/GPU/memory into MLflow")
    _eval_flags.add_flags(p)
    refuse_secrets(p, argv)
    a = p.parse_args(argv)
    for name in ("max_steps", "batch_size", "checkpoint_every", "keep_checkpoints", "log_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.cpus_per_worker <= 0:
        p.error("--cpus-per-worker must be > 0")
    if a.no_ray and a.num_workers not in (1, (1, 1)):
        p.error("--no-ray runs one worker in this process: drop --num-workers")
    _eval_flags.check(p, a)
    refuse_bad_names(p, parts={"--run-name": a.run_name}, outputs={"--export": a.export})
    return a


def job_from(a: argparse.Namespace) -> PretrainJob:
    """The flags as typed configs (each validates itself); the micro-batch is planned first: the config is final."""
    data = read_manifest(a.data, a.endpoint_url)
    fewest, most = a.num_workers if isinstance(a.num_workers, tuple) else (a.num_workers, a.num_workers)
    launch = LaunchConfig(num_workers=most, min_workers=fewest, resize_check_seconds=a.resize_check_seconds,
                          cpus_per_worker=a.cpus_per_worker, use_gpu=a.use_gpu, no_ray=a.no_ray, storage=a.storage,
                          name=a.run_name, keep_checkpoints=a.keep_checkpoints, max_failures=a.max_failures,
                          endpoint_url=a.endpoint_url)
    model = model_config(a.preset, a.init, data.vocab.size, launch.init_cache, a.endpoint_url)
    micro, accum = plan_for_workers(model.bert, a.batch_size, (fewest, most), max(a.length_buckets or (
        data.max_seq_length,)), data.max_predictions, use_gpu=a.use_gpu, budget_gb=a.memory_gb,
        requested=a.micro_batch_size, model_name=a.init or a.preset)
    config = PretrainConfig(
        model=model, max_steps=a.max_steps, memory=MemoryConfig(budget_gb=a.memory_gb),
        data=DataConfig(train=data, endpoint_url=a.endpoint_url, batch_size=a.batch_size, micro_batch_size=micro,
                        accum=accum, length_bucketing=a.length_bucketing, length_buckets=a.length_buckets or (),
                        dynamic_masking=a.dynamic_masking, mask_id=data.vocab.mask_id,
                        masked_lm_prob=data.masked_lm_prob, packing=a.packing, pack_sequences=a.pack_sequences),
        optimizer=OptimizerConfig(name=a.optimizer, lr=lr_or_default(a.lr, model.bert.hidden_size, "pretrain"),
                                  warmup_steps=warmup_or_default(a.warmup_steps, a.max_steps), decay=a.decay,
                                  weight_decay=a.weight_decay, poly_power=a.poly_power, max_grad_norm=a.max_grad_norm),
        eval=_eval_flags.eval_config(a),
        checkpoint=CheckpointConfig(every=a.checkpoint_every, vocab_url=data.vocab.url,
                                    do_lower_case=data.vocab.do_lower_case),
        tracking=TrackingConfig(system_metrics=not a.no_system_metrics, log_every=a.log_every),
        runtime=RuntimeConfig(
            device="cuda" if a.use_gpu else "cpu", compile=a.compile, compile_backend=a.compile_backend,
            cuda_graphs=a.cuda_graphs, compile_cache=str(Path(a.compile_cache).resolve()) if a.compile_cache else None,
            fused_kernels=kernel_options.FUSED_KERNELS[a.fused_kernels], seed=a.seed,
            low_precision_residual=a.low_precision_residual, threads=a.threads or max(1, round(a.cpus_per_worker)),
            peak_flops=a.peak_tflops * 1e12 if a.peak_tflops else None,
            max_seconds=a.max_minutes * 60 if a.max_minutes else None))
    return PretrainJob(config, launch, resolve_tracking_uri(a.mlflow_tracking_uri), a.experiment, a.parent_run_id,
                       a.export, flags=vars(a))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging()
    interrupt.install("pretrain")  # Ctrl-C / SIGTERM: stop after a checkpoint, run KILLED, exit 130 / 143
    # The default name says what is trained and when, so the runs of an experiment can be told apart.
    source = Path(args.init.rstrip("/")).name if args.init else args.preset
    args.run_name = args.run_name or f"pretrain-{source}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        result = run_pretraining(job_from(args))
    except ValueError as e:  # users' mistakes: one line saying what to fix
        log.error("%s", e)
        return 2
    except KeyboardInterrupt as e:  # cluster.interrupt: after a checkpoint, or before training began
        what = (f"{e}; MLflow run ended KILLED. To resume, run the same command again" if "checkpoint" in str(e)
                else f"{e or 'interrupted'} before training began. To start, run the same command again")
        print(f"pretrain: {what} (--run-name {args.run_name})", file=sys.stderr, flush=True)
        return interrupt.exit_code(e)
    log.info("done%s: MLflow run %s, checkpoints under %s%s", f" (stopped by {result.stopped})" if result.stopped
             else "", result.run_id, result.checkpoints,
             f", model exported to {result.export}" if result.export else "")
    summary = {"run_name": args.run_name, "mlflow_run_id": result.run_id, "checkpoints": result.checkpoints,
               "export": result.export, **result.metrics, "stopped": result.stopped, "collapse": result.collapse,
               "slowed": result.slowed}
    print(json.dumps(redact(summary)), flush=True)
    return 0


if __name__ == "__main__":
    run_main(main, "pretrain")
