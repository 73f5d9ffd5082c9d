"""The Ray Train worker function of `jobs/pretrain.py`: build or resume the model, stream this rank's batches,
step, log (rank 0 -> stdout + MLflow), evaluate, checkpoint. Plumbing only: the step is `bert_core.training`, the
batches `pipeline.batching`.

Reproducibility on resume: the data position is the step (every rank has consumed `step * accum` micro-batches of
its deterministic stream), dropout is re-seeded from (seed, rank, step) before each step and dynamic masking from
(seed, rank, batch index), so a resumed run replays exactly the batches and random draws of an uninterrupted one.
"""
from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
from pathlib import Path

import torch

log = logging.getLogger("jobs.pretrain")

PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}


def _peak_flops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


class _MlflowSink:
    """Rank 0's MLflow writer: metrics into the job's one run (created by the driver), plus system metrics."""

    def __init__(self, tracking_uri: str, run_id: str, system_metrics: bool) -> None:
        from mlflow.tracking import MlflowClient

        self.client, self.run_id, self.monitor = MlflowClient(tracking_uri), run_id, None
        # After a worker-group restart (or a rerun with the same --run-name) training replays the steps since the last
        # checkpoint; their metrics are already in the run. Log each (metric, step) once: skip what is there.
        self.logged = {key: max((m.step for m in self.client.get_metric_history(run_id, key)), default=-1)
                       for key in self.client.get_run(run_id).data.metrics}
        if system_metrics:
            try:
                import mlflow
                from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

                mlflow.set_tracking_uri(tracking_uri)
                self.monitor = SystemMetricsMonitor(run_id, sampling_interval=10, samples_before_logging=1)
                self.monitor.start()
            except Exception as e:  # noqa: BLE001 (system metrics are nice to have, never fatal)
                log.warning("system metrics are off: %s", e)

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()
                 if not math.isnan(v) and step > self.logged.get(k, -1)]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.finish()


def _build_model(cfg: dict, checkpoint_dir: Path | None):
    from bert_core import BertConfig, BertForPreTraining

    if checkpoint_dir is not None:
        return BertForPreTraining.from_pretrained(checkpoint_dir / "model")
    if cfg["init"]:
        model, info = BertForPreTraining.from_pretrained(cfg["init"], output_loading_info=True)
        if info["missing_keys"]:
            log.warning("--init %s lacked %s (freshly initialised)", cfg["init"], info["missing_keys"])
        return model
    torch.manual_seed(cfg["seed"])  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    return BertForPreTraining(BertConfig.from_dict(cfg["model_config"]))


def _stream(cfg: dict, rank: int, world: int, start_batch: int):
    from pipeline.batching import Prefetcher, RankStream, Remasker, StreamConfig, micro_batches, read_shard

    data = cfg["data"]
    remasker = None
    if cfg["dynamic_masking"]:
        remasker = Remasker(vocab_size=cfg["model_config"]["vocab_size"], mask_id=data["mask_id"],
                            max_predictions=data["max_predictions"], masked_lm_prob=data["masked_lm_prob"])
    scfg = StreamConfig(micro_batch_size=cfg["micro_batch_size"], seed=cfg["seed"], rank=rank, world_size=world,
                        max_predictions=data["max_predictions"], length_bucketing=cfg["length_bucketing"],
                        remasker=remasker)
    if cfg["data_loader"] == "ray-data":
        window = scfg.bucket_window if scfg.length_bucketing else 1
        first_window, skip = divmod(start_batch, window)
        source = micro_batches(_ray_data_rows(first_window * window * scfg.micro_batch_size), scfg, first_window, skip)
    else:
        source = iter(RankStream(data["shard_rows"], lambda i: read_shard(data["shard_urls"][i],
                                                                          data["storage_options"]),
                                 scfg, start_batch=start_batch))
    return Prefetcher(source, depth=max(4, 2 * cfg["accum"]))


def _ray_data_rows(drop: int):
    """This worker's rows from Ray Data (`get_dataset_shard`), epoch after epoch, the first `drop` rows skipped.

    Train's DataConfig splits with `streaming_split(equal=True)`: every rank gets the same number of rows per epoch
    (Ray Data drops at most world_size - 1 rows of an epoch to make it so), and rows carry over epoch boundaries, so
    ranks stay equal. Which rows a rank gets depends on timing: a resumed run skips as many rows as were consumed,
    not the same rows (use the default loader for an exact replay).
    """
    import ray.train

    from pipeline.batching import Rows

    shard = ray.train.get_dataset_shard("train")
    while True:
        for table in shard.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2):
            rows = Rows.from_arrow(table)
            if drop >= len(rows):
                drop -= len(rows)
                continue
            yield rows.slice(drop, len(rows)) if drop else rows
            drop = 0


def _eval_rows(cfg: dict):
    from pipeline.batching import Rows, read_shard

    ev = cfg["eval_data"]
    if not ev:
        return None
    rows, have = [], 0
    for url in ev["shard_urls"]:
        rows.append(read_shard(url, ev["storage_options"]))
        have += len(rows[-1])
        if cfg["eval_sequences"] and have >= cfg["eval_sequences"]:
            break
    return Rows.concat(rows)


def _save_checkpoint(raw_model, optimizer, scheduler, cfg: dict, step: int, world: int) -> str:
    from bert_core.training import save_train_state

    tmp = Path(tempfile.mkdtemp(prefix=f"ckpt-{step:08d}-"))
    vocab = tmp / "_vocab.txt"
    vocab.write_text(cfg["vocab_text"])
    raw_model.save_pretrained(tmp / "model", vocab_file=vocab, do_lower_case=cfg["do_lower_case"])
    vocab.unlink()
    save_train_state(tmp, optimizer, scheduler, extra={
        "step": step, "world_size": world, "micro_batch_size": cfg["micro_batch_size"], "accum": cfg["accum"],
        "seed": cfg["seed"], "data_position": {"micro_batches_per_rank": step * cfg["accum"],
                                               "dataset_config_hash": cfg["data"]["config_hash"]},
        "rng": "dropout: torch.manual_seed(sha256('dropout', seed, rank, step)) before each step; dynamic masking: "
               "numpy Generator(sha256('remask', seed, rank, micro-batch index))",
        "mlflow_run_id": cfg["mlflow"]["run_id"], "run_name": cfg["run_name"],
    })
    return str(tmp)


def train_loop(cfg: dict) -> None:
    import ray.train
    import ray.train.torch

    from bert_core import build_optimizer, build_scheduler
    from bert_core.flops import flops_per_sequence
    from bert_core.training import MetricSums, evaluate, load_train_state, to_device, train_step
    from pipeline.batching import finite_batches, seed_for

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    if device.type == "cpu":
        torch.set_num_threads(cfg["threads"])
    autocast = torch.bfloat16 if device.type == "cuda" else None

    checkpoint = ray.train.get_checkpoint()
    ckpt_ctx = checkpoint.as_directory() if checkpoint is not None else None
    ckpt_dir = Path(ckpt_ctx.__enter__()) if ckpt_ctx is not None else None
    try:
        raw = _build_model(cfg, ckpt_dir).to(device)
        raw.train()
        optimizer = build_optimizer(raw, cfg["optimizer"], lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                                    fused=True if device.type == "cuda" and cfg["optimizer"] == "adamw" else None)
        scheduler = build_scheduler(optimizer, cfg["warmup_steps"], cfg["max_steps"], decay=cfg["decay"],
                                    power=cfg["poly_power"])
        step = 0
        if ckpt_dir is not None:
            state = load_train_state(ckpt_dir, optimizer, scheduler)
            step = int(state["step"])
            if (state["world_size"], state["micro_batch_size"], state["accum"], state["seed"]) != (
                    world, cfg["micro_batch_size"], cfg["accum"], cfg["seed"]):
                log.warning("resuming with a different world size / batch geometry / seed than the checkpoint's: "
                            "training continues, but not on the exact batch sequence of the original run")
            if rank == 0:
                log.info("resumed from %s at step %d", checkpoint.path, step)
    finally:
        if ckpt_ctx is not None:
            ckpt_ctx.__exit__(None, None, None)

    model = ray.train.torch.prepare_model(raw) if world > 1 else raw
    if cfg["compile"]:
        model = torch.compile(model)
    batches = _stream(cfg, rank, world, start_batch=step * cfg["accum"])
    eval_rows = _eval_rows(cfg)
    model_config = raw.config
    peak = _peak_flops(device, cfg.get("peak_flops"))
    sink = _MlflowSink(cfg["mlflow"]["tracking_uri"], cfg["mlflow"]["run_id"], cfg["mlflow"]["system_metrics"]) \
        if rank == 0 else None

    if sink is not None and step:
        sink.client.set_tag(sink.run_id, "resumed_from_step", str(step))  # visible proof of a resume in the UI
    sums, t_window, wait_at_window = MetricSums(), time.perf_counter(), batches.wait_seconds
    t_start, budget = time.perf_counter(), cfg.get("max_seconds")
    try:
        while step < cfg["max_steps"]:
            micro = [to_device(next(batches), device) for _ in range(cfg["accum"])]
            torch.manual_seed(seed_for("dropout", cfg["seed"], rank, step) % 2**63)
            out = train_step(model, optimizer, micro, scheduler=scheduler, max_grad_norm=cfg["max_grad_norm"],
                             autocast_dtype=autocast, sums=sums)
            step += 1
            last = step == cfg["max_steps"]
            metrics: dict[str, float] = {}
            if step % cfg["log_every"] == 0 or last:
                elapsed = time.perf_counter() - t_window
                time_up = float(bool(budget) and time.perf_counter() - t_start > budget)
                waits = torch.tensor([batches.wait_seconds - wait_at_window, elapsed, time_up], dtype=torch.float64)
                total = sums.all_reduce()
                if torch.distributed.is_initialized():
                    waits = _all_reduce_cpu(waits)
                if waits[2] > 0 and not last:  # every rank sees the same sum, so all stop at this step
                    log.info("step %d: the --max-minutes budget is spent; finishing here", step)
                    last = True
                metrics = total.summary()
                metrics.update(
                    learning_rate=float(out["learning_rate"]), grad_norm=float(out["grad_norm"]),
                    sequences_per_second=total.sequences / elapsed, tokens_per_second=total.tokens / elapsed,
                    data_wait_fraction=float(waits[0] / waits[1]))
                if peak:
                    seq_len = total.tokens / max(total.sequences, 1)
                    metrics["mfu"] = (flops_per_sequence(model_config, round(seq_len)) *
                                      metrics["sequences_per_second"] / (peak * world))
                sums, t_window, wait_at_window = MetricSums(), time.perf_counter(), batches.wait_seconds
            if eval_rows is not None and ((cfg["eval_every"] and step % cfg["eval_every"] == 0) or last):
                t_eval = time.perf_counter()
                ev_batches = (to_device(b, device) for b in finite_batches(
                    eval_rows, cfg["micro_batch_size"], rank, world, cfg["eval_sequences"] or None,
                    cfg["eval_data"]["max_predictions"]))
                metrics.update(evaluate(raw, ev_batches, autocast).all_reduce().summary(prefix="eval_"))
                t_window += time.perf_counter() - t_eval  # evaluation does not count against throughput
            if rank == 0 and metrics:
                log.info("step %d/%d %s", step, cfg["max_steps"],
                         " ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
                sink.log(metrics, step)
            if step % cfg["checkpoint_every"] == 0 or last:
                path = _save_checkpoint(raw, optimizer, scheduler, cfg, step, world) if rank == 0 else None
                ray.train.report({"step": step, **{k: v for k, v in metrics.items()}},
                                 checkpoint=ray.train.Checkpoint.from_directory(path) if path else None,
                                 checkpoint_dir_name=f"checkpoint-{step:08d}")
                if path:
                    shutil.rmtree(path, ignore_errors=True)
            if last:
                break
    finally:
        batches.close()
        if sink is not None:
            sink.close()


def _all_reduce_cpu(t: torch.Tensor) -> torch.Tensor:
    backend = torch.distributed.get_backend()
    dev = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    t = t.to(dev)
    torch.distributed.all_reduce(t)
    return t.cpu()

