"""Pre-train BERT (MLM + NSP) on Ray Train from the shards of `jobs/build_dataset.py`, tracked in one MLflow run.

    python jobs/pretrain.py --data DATASET_URL [--eval-data URL] --preset bert_tiny --max-steps 1000 \
        --batch-size 256 [--micro-batch-size 64] [--num-workers 2 --cpus-per-worker 1 | --use-gpu] \
        [--storage ./runs --run-name NAME --checkpoint-every 200] [--init CHECKPOINT] [--export DIR_OR_URL]
    ray job submit --working-dir . -- python jobs/pretrain.py ...          # the same flags, on a cluster

Checked here, before any worker starts: the flags, the dataset manifest(s) (vocabulary size and max length against
the model, the same vocabulary in train and eval data and in `--init`), the batch geometry and the MLflow store.

Fault tolerance: checkpoints go to STORAGE/RUN_NAME every `--checkpoint-every` steps (the last `--keep-checkpoints`
kept). A dead worker makes Ray Train restart the group from the last checkpoint (`--max-failures`); running the same
command again with the same `--run-name` resumes from there too, into the same MLflow run (found by its
`bert.run_name` tag). The data position is part of the checkpoint, so the resumed run sees the same batches.

Data (`--data-loader stream`, the default) reaches the workers through `training.loader.RankStream`: each rank
reads its own deterministic part of the balanced shards in a background thread. That keeps ranks exactly equal (no
hang at the end of an epoch, no row dropped: epochs wrap around) and makes the data position a number, which Ray
Data's demand-driven `streaming_split` cannot give; it also needs no Ray CPU slot, so the 2-CPU starvation hang
cannot occur. `--data-loader ray-data` streams the same shards through Ray Data (`read_parquet` ->
`get_dataset_shard`, equal rows per rank) into the same batching; its resume skips rows rather than replaying them.
Leave CPUs for its read tasks (fractional `--cpus-per-worker`).

This job is flags -> `training.PretrainConfig` -> call: the loop is `training.fit`, run by Ray Train workers
(`training.ray_worker.pretrain_worker`, DDP) or, with `--no-ray`, in this process (one CPU or GPU, checkpoints in
STORAGE/RUN_NAME on local disk). Batches are padded to a few fixed widths (`--length-buckets`, default multiples
of max_seq_length / 4) and `--compile` is on by default on CUDA; the compile warm-up steps are kept out of the
throughput metrics (sequences/s, tokens/s, data_wait_fraction, and mfu of real tokens on a GPU).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jobs._common import init_ray, setup_logging
from pipeline.schema import Manifest, read_manifest
from pipeline.storage import is_url, upload_tree
from training.config import (CheckpointConfig, ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig,
                             TrackingConfig)
from training.loader import DataConfig, EvalConfig, ShardSet
from training.tracking import (RUN_NAME_TAG, Run, check_tracking_reachable, flatten_params, open_run,
                               resolve_tracking_uri)

log = logging.getLogger("jobs.pretrain")

LINEAGE_FILE = "bert_pretrain_run.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pretrain", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = p.add_argument_group("data")
    d.add_argument("--data", required=True, help="dataset directory written by jobs/build_dataset.py (local/s3://)")
    d.add_argument("--eval-data", help="held-out dataset (same vocabulary) for eval_* metrics")
    d.add_argument("--eval-sequences", type=int, default=2048, help="eval on the first N sequences (0 = all)")
    d.add_argument("--endpoint-url", help="S3-compatible endpoint for s3:// data and storage (MinIO, Ceph, ...)")
    d.add_argument("--data-loader", choices=("stream", "ray-data"), default="stream",
                   help="stream: each rank reads its deterministic part of the shards (exact resume); ray-data: "
                        "Ray Data read_parquet + get_dataset_shard (equal rows per rank, order not reproducible)")
    d.add_argument("--length-bucketing", action=argparse.BooleanOptionalAction, default=True,
                   help="batch rows of similar length together (little padding at the bucket widths)")
    d.add_argument("--length-buckets", type=_widths, help="comma-separated widths batches are padded to, e.g. "
                   "32,64,96,128 (default: multiples of the dataset's max_seq_length / 4)")
    d.add_argument("--dynamic-masking", action="store_true", help="redraw MLM masks every time a row is read")
    m = p.add_argument_group("model and optimisation")
    m.add_argument("--preset", default="bert_base", help="bert_tiny|bert_mini|bert_small|bert_medium|bert_base|...")
    m.add_argument("--init", help="start from an export, a checkpoint directory or any HF BERT directory")
    m.add_argument("--max-steps", type=int, required=True)
    m.add_argument("--batch-size", type=int, default=256, help="GLOBAL sequences per optimizer step")
    m.add_argument("--micro-batch-size", type=int, help="sequences per forward per worker (default: all of them)")
    m.add_argument("--optimizer", choices=("adamw", "lamb"), default="adamw")
    m.add_argument("--lr", type=float, default=1e-4)
    m.add_argument("--warmup-steps", type=int, default=0)
    m.add_argument("--weight-decay", type=float, default=0.01)
    m.add_argument("--decay", choices=("linear", "poly"), default="linear")
    m.add_argument("--poly-power", type=float, default=0.5, help="power of --decay poly")
    m.add_argument("--max-grad-norm", type=float, default=1.0, help="0 disables clipping")
    m.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the model (default: on with --use-gpu, off on CPU)")
    m.add_argument("--compile-backend", default="inductor", help="torch.compile backend (aot_eager: no codegen)")
    m.add_argument("--seed", type=int, default=12345)
    r = p.add_argument_group("resources")
    r.add_argument("--num-workers", type=int, default=1)
    r.add_argument("--use-gpu", action="store_true", help="one GPU per worker, NCCL, bf16 autocast, fused AdamW")
    r.add_argument("--cpus-per-worker", type=float, default=1.0,
                   help="Ray CPUs per worker; fractions are fine (the data thread needs no Ray slot)")
    r.add_argument("--threads", type=int, help="torch threads per CPU worker (default: round(cpus-per-worker))")
    r.add_argument("--peak-tflops", type=float, help="accelerator peak for mfu (default: known GPUs' bf16 peak)")
    r.add_argument("--no-ray", action="store_true", help="run training.fit in this process (one worker: CPU, or "
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
    c.add_argument("--experiment", default="bert-pretrain")
    c.add_argument("--parent-run-id", help="log this run as a child of that MLflow run")
    c.add_argument("--log-every", type=int, default=50)
    c.add_argument("--eval-every", type=int, default=0, help="0 = only at the end (when --eval-data is given)")
    c.add_argument("--max-minutes", type=float, help="wall-clock budget of the training loop: stop (with a final "
                   "eval, checkpoint and export) at the first log step after it; the lr schedule still spans --max-steps")
    c.add_argument("--no-system-metrics", action="store_true", help="do not sample CPU/GPU/memory into MLflow")
    a = p.parse_args(argv)
    for name in ("max_steps", "batch_size", "num_workers", "checkpoint_every", "keep_checkpoints", "log_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.cpus_per_worker <= 0:
        p.error("--cpus-per-worker must be > 0")
    if a.no_ray and (a.num_workers != 1 or a.data_loader != "stream"):
        p.error("--no-ray runs one worker with the stream loader: drop --num-workers / --data-loader ray-data")
    return a


def _widths(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers, e.g. 32,64,96,128") from None


# ---- checks at start ---------------------------------------------------------------------------------------------

def batch_geometry(args: argparse.Namespace) -> tuple[int, int]:
    """(micro-batch size, accumulation steps) from the global batch and the worker count."""
    if args.batch_size % args.num_workers:
        raise ValueError(f"--batch-size {args.batch_size} does not split over {args.num_workers} workers; "
                         f"use a multiple of {args.num_workers}")
    per_worker = args.batch_size // args.num_workers
    micro = args.micro_batch_size or per_worker
    if micro < 1 or per_worker % micro:
        raise ValueError(f"--micro-batch-size {micro} must divide the {per_worker} sequences each worker gets per "
                         "step (--batch-size / --num-workers)")
    return micro, per_worker // micro


def storage_filesystem(url: str, endpoint_url: str | None):
    """(pyarrow filesystem or None, path) for RunConfig. Credentials are resolved here (the driver's
    environment) so that the Ray Train controller, which does not share it, can use the filesystem too."""
    if not is_url(url):
        return None, str(Path(url.removeprefix("file://")).resolve())
    import pyarrow.fs

    from pipeline import storage

    fs, path = storage.filesystem_for(url, endpoint_url)
    if storage.protocol_of(url) in ("s3", "s3a"):
        import s3fs

        fs = s3fs.S3FileSystem(key=os.environ.get("AWS_ACCESS_KEY_ID"), secret=os.environ.get("AWS_SECRET_ACCESS_KEY"),
                               token=os.environ.get("AWS_SESSION_TOKEN"),
                               client_kwargs={"endpoint_url": endpoint_url} if endpoint_url else {})
    return pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs)), path


def build_config(args, micro: int, accum: int, data: Manifest, eval_data: Manifest | None,
                 tracking: TrackingConfig) -> PretrainConfig:
    """The flags as the trainer's typed config (its components validate themselves)."""
    use_gpu = args.use_gpu
    storage_dir = str(Path(args.storage.removeprefix("file://")).resolve() / args.run_name) if args.no_ray else None
    return PretrainConfig(
        model=ModelConfig.resolve(args.preset, args.init, data.vocab.size),
        data=DataConfig(train=ShardSet.from_manifest(data, args.endpoint_url), micro_batch_size=micro, accum=accum,
                        loader=args.data_loader,
                        length_bucketing=args.length_bucketing, length_buckets=args.length_buckets or (),
                        dynamic_masking=args.dynamic_masking, mask_id=data.vocab.mask_id,
                        masked_lm_prob=data.masked_lm_prob),
        max_steps=args.max_steps,
        optimizer=OptimizerConfig(name=args.optimizer, lr=args.lr, weight_decay=args.weight_decay,
                                  warmup_steps=args.warmup_steps, decay=args.decay, poly_power=args.poly_power,
                                  max_grad_norm=args.max_grad_norm),
        eval=EvalConfig(data=ShardSet.from_manifest(eval_data, args.endpoint_url), sequences=args.eval_sequences,
                        every=args.eval_every)
        if eval_data else None,
        checkpoint=CheckpointConfig(every=args.checkpoint_every, keep=args.keep_checkpoints, directory=storage_dir,
                                    vocab_url=data.vocab.url, do_lower_case=data.vocab.do_lower_case),
        tracking=tracking,
        runtime=RuntimeConfig(device="cuda" if use_gpu else "cpu", compile=args.compile,
                              compile_backend=args.compile_backend,
                              threads=args.threads or max(1, round(args.cpus_per_worker)),
                              peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None,
                              max_seconds=args.max_minutes * 60 if args.max_minutes else None, seed=args.seed),
    )


def run_params(args, config: PretrainConfig, micro: int, accum: int) -> dict[str, Any]:
    """The flags as given, plus the trainer's config (`PretrainConfig.to_params`, as the checkpoints hold it)."""
    flags = {k: v for k, v in vars(args).items() if v is not None}
    params = {**flags, **flatten_params(config)}
    params.update({"micro_batch_size_resolved": micro, "grad_accumulation_steps": accum,
                   "dataset.instances": sum(config.data.train.shard_rows)})
    if config.eval is not None:
        params["eval_dataset.instances"] = sum(config.eval.data.shard_rows)
    # Where this run is tracked is the run itself: not a setting (and unknown before the run exists).
    for key in ("tracking.run_id", "tracking.tracking_uri"):
        params.pop(key, None)
    return params


def export_model(checkpoint_dir: Path, export_dir: Path, run: Run) -> Path:
    if export_dir.exists():
        shutil.rmtree(export_dir)
    shutil.copytree(Path(checkpoint_dir) / "model", export_dir)
    lineage = {"mlflow_run_id": run.run_id, "tracking_uri": run.tracking_uri}
    (export_dir / LINEAGE_FILE).write_text(json.dumps(lineage) + "\n")
    return export_dir


# ---- main ----------------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging()
    # The default name says what is trained and when, so runs of one experiment can be told apart.
    source = Path(args.init.rstrip("/")).name if args.init else args.preset
    args.run_name = args.run_name or f"pretrain-{source}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        data = read_manifest(args.data, args.endpoint_url)
        eval_data = read_manifest(args.eval_data, args.endpoint_url) if args.eval_data else None
        micro, accum = batch_geometry(args)
        config = build_config(args, micro, accum, data, eval_data, TrackingConfig(
            run_name=args.run_name, system_metrics=not args.no_system_metrics, log_every=args.log_every))
        tracking_uri = resolve_tracking_uri(args.mlflow_tracking_uri)
        check_tracking_reachable(tracking_uri)
        fs, storage_path = storage_filesystem(args.storage, args.endpoint_url)
        if args.export and is_url(args.export):
            from pipeline.storage import check_writable

            check_writable(args.export, args.endpoint_url)  # a missing bucket fails now, not after training
    except ValueError as e:
        log.error("%s", e)
        return 2

    tags = {RUN_NAME_TAG: args.run_name, "job": "pretrain", "dataset.url": args.data,
            "dataset.manifest_sha256": data.sha256, "dataset.config_hash": data.config_hash,
            "dataset.vocab_sha256": data.vocab.sha256, "storage": f"{args.storage.rstrip('/')}/{args.run_name}"}
    if eval_data:
        tags.update({"eval_dataset.url": args.eval_data, "eval_dataset.manifest_sha256": eval_data.sha256})
    if args.init:
        tags["init"] = args.init
        lineage = Path(args.init) / LINEAGE_FILE
        if lineage.is_file():
            tags["lineage.init_run_id"] = json.loads(lineage.read_text()).get("mlflow_run_id", "")
    try:
        run = open_run(tracking_uri, args.experiment, args.run_name, params=run_params(args, config, micro, accum),
                       tags=tags, parent_run_id=args.parent_run_id, resume_by=RUN_NAME_TAG)
    except ValueError as e:
        log.error("%s", e)
        return 2
    config = dataclasses.replace(config, tracking=dataclasses.replace(
        config.tracking, tracking_uri=tracking_uri, run_id=run.run_id))

    with run.ending():
        with train(args, config, data, fs, storage_path) as final_checkpoint:
            with tempfile.TemporaryDirectory() as tmp:
                local_export = args.export and not is_url(args.export)
                export_dir = Path(args.export).resolve() if local_export else Path(tmp) / "export"
                export_model(final_checkpoint, export_dir, run)
                run.log_artifacts(export_dir, artifact_path="model")
                if args.export and not local_export:
                    upload_tree(export_dir, args.export, args.endpoint_url)
        if args.export:
            log.info("exported the model (Hugging Face layout) to %s", args.export if not local_export else export_dir)
    log.info("done: run %s, checkpoints under %s/%s", run.run_id, args.storage, args.run_name)
    return 0


@contextlib.contextmanager
def train(args, config: PretrainConfig, data: dict, fs, storage_path: str):
    """Run training (in this process with --no-ray, else on Ray Train); yields the final checkpoint's directory."""
    if args.no_ray:
        from training import fit

        result = fit(config)
        if result.checkpoint is None:
            raise RuntimeError("training finished without a checkpoint; see the log above")
        yield Path(result.checkpoint)
        return
    result = fit_on_ray(args, config, data, fs, storage_path)
    with result.checkpoint.as_directory() as d:
        yield Path(d)


def fit_on_ray(args, config: PretrainConfig, data: dict, fs, storage_path: str):
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from pipeline.storage import aws_env
    from training.ray_worker import pretrain_worker

    init_ray(dashboard=True)
    resources = {"CPU": args.cpus_per_worker}
    if args.use_gpu:
        resources["GPU"] = 1
    env = aws_env()
    datasets = None
    if args.data_loader == "ray-data":
        import ray.data

        from pipeline.schema import SHARD_COLUMNS

        read_fs, _ = storage_filesystem(args.data, args.endpoint_url)
        urls = list(config.data.train.shard_urls)
        if read_fs is not None:
            urls = [u.split("://", 1)[1] for u in urls]
        # Small read tasks: a whole CPU each would not fit beside the training workers on a small box (Ray Data
        # splits what Train leaves it between its operators, and a 1-CPU task may never be scheduled).
        datasets = {"train": ray.data.read_parquet(urls, filesystem=read_fs, columns=list(SHARD_COLUMNS), num_cpus=0.25)}
    trainer = TorchTrainer(
        pretrain_worker,
        train_loop_config={"config": config},
        torch_config=TorchConfig(backend="nccl" if args.use_gpu else "gloo"),
        datasets=datasets,
        scaling_config=ray.train.ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu,
                                               resources_per_worker=resources),
        run_config=ray.train.RunConfig(
            name=args.run_name, storage_path=storage_path, storage_filesystem=fs,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=args.keep_checkpoints),
            failure_config=ray.train.FailureConfig(max_failures=args.max_failures),
            worker_runtime_env={"env_vars": env} if env else None,
        ),
    )
    return trainer.fit()


if __name__ == "__main__":
    sys.exit(main())
