"""Pre-train BERT (MLM + NSP) from the shards of `jobs/build_dataset.py` on Ray Train, tracked in one MLflow run.

    python jobs/pretrain.py --data DATASET_URL [--eval-data URL] --preset bert_tiny --max-steps 1000 \
        --batch-size 256 [--micro-batch-size 64] [--num-workers 2 --cpus-per-worker 1 | --use-gpu] \
        [--storage ./runs --run-name NAME --checkpoint-every 200] [--init CHECKPOINT] [--export DIR_OR_URL]
    ray job submit --working-dir . -- python jobs/pretrain.py ...          # the same flags, on a cluster

Flags -> `training.PretrainConfig` (checked: dataset manifests against the model, one vocabulary for train, eval
and `--init`, the batch geometry) -> `pretraining.pretrain_job.run_pretraining`, which checks the MLflow store and
the export destination, opens the run and launches `pretraining.loop.fit` on Ray Train workers (DDP) or, with `--no-ray`,
in this process. The last line on stdout is a JSON object: the run, where the checkpoints and export are, the
final metrics.

The micro-batch is sized to the workers' memory (`pretraining.memory`); a diverging run rolls back, then fails in one
line naming the step and what to try, its MLflow run FAILED (`training.guard`).
Fault tolerance: checkpoints go to STORAGE/RUN_NAME every `--checkpoint-every` steps (the last `--keep-checkpoints`
kept). A dead worker makes Ray Train restart the group from the last checkpoint (`--max-failures`); running the same
command again with the same `--storage` and `--run-name` resumes from there too, into the same MLflow run (found by
its `bert.run_checkpoints` tag). The data position is part of the checkpoint, so the resumed run sees the same
batches. One job per storage and run name: a second one refuses, naming the first (pipeline/safe_io/lease.py).

Data: each rank reads its own deterministic part of the balanced shards in a background thread
(`pretraining.loader`): ranks stay exactly equal, the data position is a number, and no Ray CPU slot is needed (no
2-CPU starvation hang). Batches are padded to a few fixed widths (`--length-buckets`) and
`--compile` is on by default on CUDA; compile warm-up steps are kept out of the throughput metrics.
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

from jobs._common import HelpFormatter, refuse_secrets, setup_logging
from pipeline.safe_io.redact import redact
from pipeline.schema import read_manifest
from pretraining import kernel_options
from pretraining.config import CheckpointConfig, ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig
from tracking.config import TrackingConfig
from training.defaults import WARMUP_FRACTION, default_lr, default_warmup_steps
from training.launch import LaunchConfig
from pretraining.loader import DataConfig, EvalConfig, batch_geometry
from pretraining.memory import MemoryConfig, micro_batch_for
from pretraining.pretrain_job import PretrainJob, run_pretraining
from tracking.store import DEFAULT_EXPERIMENT, resolve_tracking_uri

log = logging.getLogger("jobs.pretrain")
EVAL_SEQUENCES = EvalConfig.sequences
EVAL_POINTS = 5  # evaluations of a run by default: enough for a curve of held-out accuracy, at little cost


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pretrain", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter, fromfile_prefix_chars="@")
    d = p.add_argument_group("data")
    d.add_argument("--data", required=True, help="dataset directory written by jobs/build_dataset.py (local/s3://)")
    d.add_argument("--eval-data", help="held-out dataset (same vocabulary) for eval_* metrics")
    d.add_argument("--eval-sequences", type=int,
                   help=f"eval on the first N sequences (0 = all) (default: {EVAL_SEQUENCES})")
    d.add_argument("--endpoint-url", help="S3-compatible endpoint for s3:// data and storage (MinIO, Ceph, ...)")
    d.add_argument("--length-bucketing", action=argparse.BooleanOptionalAction, default=True,
                   help="batch rows of similar length together (little padding at the bucket widths)")
    d.add_argument("--length-buckets", type=_widths, help="comma-separated widths batches are padded to, e.g. "
                   "32,64,96,128 (default: multiples of the dataset's max_seq_length / 4)")
    d.add_argument("--dynamic-masking", action="store_true", help="redraw MLM masks every time a row is read")
    d.add_argument("--packing", action="store_true",
                   help="pack whole sequences into max_seq_length-wide rows instead of padding (one shape per step; "
                        "--batch-size and --micro-batch-size then count packed rows)")
    d.add_argument("--pack-sequences", type=int, default=3, help="at most this many sequences per packed row")
    m = p.add_argument_group("model and optimisation")
    m.add_argument("--preset", default="bert_base", help="bert_tiny|bert_mini|bert_small|bert_medium|bert_base|...")
    m.add_argument("--init", help="start from an export, a checkpoint directory or any HF BERT directory: a local "
                   "path or a URL (s3://, gs://; fetched into STORAGE/.init-cache, or ./.init-cache)")
    m.add_argument("--max-steps", type=int, required=True,
                   help="optimizer steps; the job states the run's estimated length after its first steps: on CPU, "
                        "a bert_base step takes minutes, a bert_tiny one well under a second")
    m.add_argument("--batch-size", type=int, default=256,
                   help="GLOBAL sequences per optimizer step. The default --lr values hold at 32 (bert_tiny, "
                        "measured) and 256 (bert_base, the paper's); far from those, scale --lr with about the "
                        "square root of the batch")
    m.add_argument("--micro-batch-size", type=int, help="sequences per forward per worker (default: as many as "
                   "fit in memory, up to all of them; gradient accumulation keeps --batch-size)")
    m.add_argument("--optimizer", choices=("adamw", "lamb"), default="adamw")
    m.add_argument("--lr", type=float,
                   help="peak learning rate. Default: chosen for the model's width (--preset or --init), 2e-3 for "
                        "bert_tiny (H=128) down to 1e-4 for bert_base (H=768) (training/defaults.py, "
                        "docs/learning-rates.md); the value used is logged. An MLM accuracy stuck at the most "
                        "frequent token's share says: higher; a divergence: lower (the job names a value)")
    m.add_argument("--warmup-steps", type=int,
                   help=f"steps over which the rate ramps up from 0. Default: {100 * WARMUP_FRACTION:.0f}%% of --max-steps; "
                        "0 turns it off (a small model at a high rate without warm-up stalls or diverges early)")
    m.add_argument("--weight-decay", type=float, default=0.01)
    m.add_argument("--decay", choices=("linear", "poly"), default="linear")
    m.add_argument("--poly-power", type=float, default=0.5, help="power of --decay poly")
    m.add_argument("--max-grad-norm", type=float, default=1.0, help="0 disables clipping")
    m.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the model (default: on with --use-gpu, off on CPU)")
    m.add_argument("--compile-backend", default="inductor", help="torch.compile backend (aot_eager: no codegen)")
    m.add_argument("--compile-cache", metavar="DIR", default=None,
                   help="TRUSTED: its contents run as code. A folder (local or a shared volume) that only you and "
                        "your jobs can write: compiled artifacts are saved there after each checkpoint and loaded "
                        "before compiling, so a restart on another node skips code generation. Default: none (a "
                        "restart on the same node uses this user's private Inductor cache; nothing compiled is ever "
                        "read from --storage)")
    m.add_argument("--cuda-graphs", action="store_true",
                   help="replay the compiled step as CUDA graphs (GPU, micro-batch = batch per worker only)")
    m.add_argument("--fused-kernels", choices=tuple(kernel_options.FUSED_KERNELS), default="auto",
                   help=kernel_options.FUSED_KERNELS_HELP)
    m.add_argument("--low-precision-residual", action="store_true", help=kernel_options.LOW_PRECISION_RESIDUAL_HELP)
    m.add_argument("--seed", type=int, default=RuntimeConfig.seed)
    r = p.add_argument_group("resources")
    r.add_argument("--num-workers", type=int, default=1)
    r.add_argument("--use-gpu", action="store_true", help="one GPU per worker, NCCL, bf16 autocast, fused AdamW")
    r.add_argument("--cpus-per-worker", type=float, default=1.0,
                   help="Ray CPUs per worker; fractions are fine (the data thread needs no Ray slot)")
    r.add_argument("--threads", type=int, help="torch threads per CPU worker (default: round(cpus-per-worker))")
    r.add_argument("--memory-gb", type=float, help="memory per worker to size the micro-batch for (default: the "
                   "free RAM of this machine shared by its workers, or the GPU's free memory at the worker's start)")
    r.add_argument("--peak-tflops", type=float, help="accelerator peak for mfu (default: known GPUs' bf16 peak)")
    r.add_argument("--no-ray", action="store_true", help="run pretraining.loop.fit in this process (one worker: CPU, or "
                   "one GPU with --use-gpu); checkpoints go to STORAGE/RUN_NAME, which must be local")
    c = p.add_argument_group("checkpoints and tracking")
    c.add_argument("--storage", default="./runs", help="where checkpoints go (local path or s3://bucket/prefix)")
    c.add_argument("--run-name", help="names the checkpoint folder and MLflow run; rerun with it to resume")
    c.add_argument("--checkpoint-every", type=int, default=1000)
    c.add_argument("--keep-checkpoints", type=int, default=3)
    c.add_argument("--max-failures", type=int, default=3, help="worker-group restarts before giving up")
    c.add_argument("--export", help="write the final model here in the Hugging Face layout (a local directory or a "
                   "URL such as s3://bucket/models/name)")
    c.add_argument("--mlflow-tracking-uri")
    c.add_argument("--experiment", default=DEFAULT_EXPERIMENT,
                   help="MLflow experiment (one for the whole pipeline: the build's, pre-training's and "
                        "fine-tuning's runs side by side)")
    c.add_argument("--parent-run-id", help="log this run as a child of that MLflow run")
    c.add_argument("--log-every", type=int, default=50)
    c.add_argument("--eval-every", type=int,
                   help=f"evaluate on --eval-data every N steps and at the end (0: only at the end). Default: "
                        f"{EVAL_POINTS} evaluations over the run, so eval_* metrics are curves")
    c.add_argument("--max-minutes", type=float, help="wall-clock budget of the training loop: stop (with a final "
                   "eval, checkpoint and export) at the first log step after it; the lr schedule still spans --max-steps")
    c.add_argument("--no-system-metrics", action="store_true", help="do not sample CPU/GPU/memory into MLflow")
    refuse_secrets(p, argv)
    a = p.parse_args(argv)
    for name in ("max_steps", "batch_size", "num_workers", "checkpoint_every", "keep_checkpoints", "log_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.cpus_per_worker <= 0:
        p.error("--cpus-per-worker must be > 0")
    if a.no_ray and a.num_workers != 1:
        p.error("--no-ray runs one worker in this process: drop --num-workers")
    if a.eval_every is not None and a.eval_every < 0:
        p.error("--eval-every must be >= 0 (0: only at the end)")
    if not a.eval_data:
        given = [f for f, v in (("--eval-every", a.eval_every), ("--eval-sequences", a.eval_sequences)) if v is not None]
        if given:
            p.error(f"{' and '.join(given)} without --eval-data: pass the held-out dataset to evaluate on, or drop "
                    f"{' and '.join(given)}")
    return a


def _widths(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers, e.g. 32,64,96,128") from None


def job_from(args: argparse.Namespace) -> PretrainJob:
    """The flags as typed configs (each validates itself; the config checks the model against its data)."""
    data = read_manifest(args.data, args.endpoint_url)
    eval_data = read_manifest(args.eval_data, args.endpoint_url) if args.eval_data else None
    launch = LaunchConfig(num_workers=args.num_workers, cpus_per_worker=args.cpus_per_worker, use_gpu=args.use_gpu,
                          no_ray=args.no_ray, storage=args.storage, name=args.run_name,
                          keep_checkpoints=args.keep_checkpoints, max_failures=args.max_failures,
                          endpoint_url=args.endpoint_url)
    model = ModelConfig.resolve(args.preset, args.init, data.vocab.size, launch.init_cache, args.endpoint_url)
    # The micro-batch that fits the workers' memory, decided before the config is built (the config is final).
    micro, accum = micro_batch_for(model.bert, batch_geometry(args.batch_size, args.num_workers),
                                   max(args.length_buckets or (data.max_seq_length,)), data.max_predictions,
                                   workers=args.num_workers, use_gpu=args.use_gpu, budget_gb=args.memory_gb,
                                   requested=args.micro_batch_size, model_name=args.init or args.preset)
    config = PretrainConfig(
        model=model,
        data=DataConfig(train=data, endpoint_url=args.endpoint_url, micro_batch_size=micro, accum=accum,
                        length_bucketing=args.length_bucketing,
                        length_buckets=args.length_buckets or (), dynamic_masking=args.dynamic_masking,
                        mask_id=data.vocab.mask_id, masked_lm_prob=data.masked_lm_prob, packing=args.packing,
                        pack_sequences=args.pack_sequences),
        max_steps=args.max_steps,
        optimizer=OptimizerConfig(name=args.optimizer, lr=lr_for(args, model.bert.hidden_size),
                                  weight_decay=args.weight_decay, warmup_steps=warmup_for(args), decay=args.decay,
                                  poly_power=args.poly_power,
                                  max_grad_norm=args.max_grad_norm),
        eval=EvalConfig(data=eval_data, every=eval_every_for(args),
                        sequences=EVAL_SEQUENCES if args.eval_sequences is None else args.eval_sequences)
        if eval_data else None,
        checkpoint=CheckpointConfig(every=args.checkpoint_every,
                                    vocab_url=data.vocab.url, do_lower_case=data.vocab.do_lower_case),
        tracking=TrackingConfig(system_metrics=not args.no_system_metrics,
                                log_every=args.log_every),
        runtime=RuntimeConfig(device="cuda" if args.use_gpu else "cpu", compile=args.compile,
                              compile_backend=args.compile_backend, cuda_graphs=args.cuda_graphs,
                              compile_cache=str(Path(args.compile_cache).resolve()) if args.compile_cache else None,
                              fused_kernels=kernel_options.FUSED_KERNELS[args.fused_kernels],
                              low_precision_residual=args.low_precision_residual,
                              threads=args.threads or max(1, round(args.cpus_per_worker)),
                              peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None,
                              max_seconds=args.max_minutes * 60 if args.max_minutes else None, seed=args.seed),
        memory=MemoryConfig(budget_gb=args.memory_gb),
    )
    return PretrainJob(config, launch, resolve_tracking_uri(args.mlflow_tracking_uri), args.experiment,
                       args.parent_run_id, args.export, flags=vars(args))


def lr_for(args: argparse.Namespace, width: int) -> float:
    """--lr, else the default for the model's width (training.defaults), said in the log."""
    if args.lr is not None:
        return args.lr
    lr = default_lr(width, "pretrain")
    log.info("--lr %g: the default for a model of hidden width %d (pass --lr to choose; docs/learning-rates.md)",
             lr, width)
    return lr


def eval_every_for(args: argparse.Namespace) -> int:
    """--eval-every, else about EVAL_POINTS evaluations over the run, on logging steps (and one at the end)."""
    if args.eval_every is not None:
        return args.eval_every
    every = max(1, -(-args.max_steps // EVAL_POINTS))
    if args.log_every < every:  # on a logging step: each held-out point beside a training one
        every = -(-every // args.log_every) * args.log_every
    log.info("--eval-every %d: %d evaluations over --max-steps %d (pass --eval-every to choose, 0 for the end only)",
             every, -(-args.max_steps // every), args.max_steps)
    return every


def warmup_for(args: argparse.Namespace) -> int:
    if args.warmup_steps is not None:
        return args.warmup_steps
    steps = default_warmup_steps(args.max_steps)
    log.info("--warmup-steps %d: %.0f%% of --max-steps %d (pass --warmup-steps to choose, 0 for none)", steps,
             100 * WARMUP_FRACTION, args.max_steps)
    return steps


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging()
    # The default name says what is trained and when, so the runs of an experiment can be told apart.
    source = Path(args.init.rstrip("/")).name if args.init else args.preset
    args.run_name = args.run_name or f"pretrain-{source}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        result = run_pretraining(job_from(args))
    except ValueError as e:  # users' mistakes: one line saying what to fix
        log.error("%s", e)
        return 2
    log.info("done%s: MLflow run %s, checkpoints under %s%s", f" (stopped by {result.stopped})" if result.stopped
             else "", result.run_id, result.checkpoints, f", model exported to {result.export}" if result.export else "")
    summary = {"run_name": args.run_name, "mlflow_run_id": result.run_id, "checkpoints": result.checkpoints,
               "export": result.export, **result.metrics, "stopped": result.stopped, "collapse": result.collapse}
    print(json.dumps(redact(summary)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
