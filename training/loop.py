"""`fit(config)`: the whole pre-training loop in one process: build or resume the model, stream this rank's
batches, step, log (rank 0), evaluate, checkpoint. Runs without Ray on a CPU or one GPU; the Ray Train worker
(`training.ray_worker`) calls the same function with its rank, DDP wrapper, checkpoint hooks and row source.

Reproducibility on resume: the data position is the step (every rank has consumed `step * accum` micro-batches of
its deterministic stream), dropout is re-seeded from (seed, rank, step) before each step and dynamic masking from
(seed, rank, batch index), so a resumed run replays exactly the batches and random draws of an uninterrupted one.

Nothing in a step reads a device value on the host: metrics stay in `MetricSums` on the device and are reduced
across ranks and read only every `log_every` steps (and at the end).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ContextManager, Protocol

import torch
from torch import nn

from bert_core import BertForPreTraining
from training.optim import build_optimizer, build_scheduler
from pipeline.rng import derive_seed as seed_for
from training import compile as compile_mod
from training import kernels
from training import loader as data_mod
from training.checkpoint import LocalCheckpoints, load_train_state, write_checkpoint
from training.config import PretrainConfig
from training.metrics import MetricSums
from training.perf import RunTotals, Window, peak_flops, throughput
from training.step import evaluate, to_device, train_step
from training.tracking import NullTracker, Tracker, make_tracker

log = logging.getLogger(__name__)


class Checkpoints(Protocol):
    def latest(self) -> ContextManager[Path | None]: ...
    def save(self, step: int, metrics: dict[str, float], write: Callable[[Path], None] | None) -> str | None: ...


@dataclass
class Worker:
    """Where this copy of the loop runs. The defaults are one process with no launcher; the Ray wrapper fills in
    its rank, world size, device, DDP wrapper, checkpoint storage and (for --data-loader ray-data) row source."""

    rank: int = 0
    world_size: int = 1
    device: torch.device | None = None
    wrap: Callable[[nn.Module], nn.Module] = lambda m: m
    checkpoints: Checkpoints | None = None
    rows: data_mod.RowSource | None = None
    tracker: Tracker | None = None  # default: from config.tracking, on rank 0


@dataclass
class FitResult:
    step: int
    metrics: dict[str, float]  # the last logged ones
    checkpoint: str | None  # the last checkpoint written (None: none, or not by this rank)
    resumed_from: int = 0
    # Over the whole run, compile warm-up excluded: sequences_per_second, tokens_per_second, data_wait_fraction,
    # padding_fraction, mean_real_tokens, seconds, sequences and (with a known peak) mfu, all ranks together.
    throughput: dict[str, float] = field(default_factory=dict)
    history: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # every logged step, on rank 0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for but torch sees no GPU; use --device cpu")
    return torch.device(name)


def _build_model(config: PretrainConfig, checkpoint_dir: Path | None) -> BertForPreTraining:
    if checkpoint_dir is not None:
        return BertForPreTraining.from_pretrained(checkpoint_dir / "model")
    if config.model.init:
        model, info = BertForPreTraining.from_pretrained(config.model.init, output_loading_info=True)
        if info["missing_keys"]:
            log.warning("init %s lacked %s (freshly initialised)", config.model.init, info["missing_keys"])
        return model
    torch.manual_seed(config.runtime.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    return BertForPreTraining(config.model.bert)


def _read_vocab(config: PretrainConfig) -> str | None:
    if not config.checkpoint.vocab_url:
        return None
    from pipeline.storage import read_bytes

    return read_bytes(config.checkpoint.vocab_url, config.data.train.endpoint_url).decode("utf-8")


def _all_reduce_host(t: torch.Tensor) -> torch.Tensor:
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return t
    dev = (torch.device("cuda", torch.cuda.current_device()) if torch.distributed.get_backend() == "nccl"
           else torch.device("cpu"))
    t = t.to(dev)
    torch.distributed.all_reduce(t)
    return t.cpu()


def _log_first_step(device: torch.device) -> None:
    """How long a (re)start took to its first step: the fast-restart figure (compile caches, present buckets)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    age = compile_mod.process_age()
    if age is not None:
        log.info("first step done %.1f s after the process started", age)


def fit(config: PretrainConfig, worker: Worker | None = None) -> FitResult:
    """Train for `config.max_steps` steps (or until the --max-minutes budget), resuming from the latest checkpoint."""
    worker = worker or Worker()
    if worker.checkpoints is None and config.checkpoint.directory:
        worker.checkpoints = LocalCheckpoints(config.checkpoint.directory.removeprefix("file://"),
                                              config.checkpoint.keep)
    rt = config.runtime
    device = worker.device or resolve_device(rt.device)
    threads_before = torch.get_num_threads()
    if device.type == "cpu" and rt.threads:
        torch.set_num_threads(rt.threads)
    try:
        return _fit(config, worker, device)
    finally:
        torch.set_num_threads(threads_before)  # the caller's process (a test session, a notebook) keeps its own


def _fit(config: PretrainConfig, worker: Worker, device: torch.device) -> FitResult:
    rt, opt_cfg, data = config.runtime, config.optimizer, config.data
    rank, world = worker.rank, worker.world_size
    bf16 = rt.precision == "bf16" or (rt.precision == "auto" and device.type == "cuda")
    autocast_dtype = torch.bfloat16 if bf16 else None
    compile_model = rt.compile if rt.compile is not None else device.type == "cuda"

    step, packed_position = 0, None
    latest = worker.checkpoints.latest() if worker.checkpoints is not None else contextlib.nullcontext(None)
    with latest as ckpt_dir:
        ckpt_dir = Path(ckpt_dir) if ckpt_dir is not None else None
        raw = _build_model(config, ckpt_dir).to(device)
        kernels.apply(raw, rt.fused_kernels, rt.low_precision_residual)
        raw.train()
        optimizer = build_optimizer(raw, opt_cfg.name, lr=opt_cfg.lr, weight_decay=opt_cfg.weight_decay,
                                    fused=True if device.type == "cuda" and opt_cfg.name == "adamw" else None)
        scheduler = build_scheduler(optimizer, opt_cfg.warmup_steps, config.max_steps, decay=opt_cfg.decay,
                                    power=opt_cfg.poly_power)
        if ckpt_dir is not None:
            state = load_train_state(ckpt_dir, optimizer, scheduler)
            step = int(state["step"])
            packed_position = data_mod.rank_position(state["data_position"], rank, world)  # packed streams only
            if compile_model:
                compile_mod.load_artifacts(ckpt_dir)  # before anything compiles: a fast restart
            if (state["world_size"], state["micro_batch_size"], state["accum"], state["seed"]) != (
                    world, data.micro_batch_size, data.accum, rt.seed):
                log.warning("resuming with a different world size / batch geometry / seed than the checkpoint's: "
                            "training continues, but not on the exact batch sequence of the original run")
            if rank == 0:
                log.info("resumed from %s at step %d", ckpt_dir, step)
    resumed_from = step

    model = worker.wrap(raw)
    if compile_model:
        model = compile_mod.compile_model(model, rt, data, device)
        if rt.precompile_buckets:
            compile_mod.precompile(model, data, raw.config.vocab_size, device, autocast_dtype)
    vocab_size = raw.config.vocab_size
    batches = data_mod.train_batches(data, vocab_size, rt.seed, rank, world, step * data.accum, worker.rows,
                                     pin_memory=device.type == "cuda", start_position=packed_position)
    eval_rows = data_mod.eval_rows(config.eval) if config.eval is not None else None
    vocab_text = _read_vocab(config) if rank == 0 else None
    peak = peak_flops(device, rt.peak_flops)
    tracker = (worker.tracker or make_tracker(config.tracking.tracking_uri, config.tracking.run_id,
                                              config.tracking.system_metrics)) if rank == 0 else NullTracker()
    if step:
        tracker.set_tag("resumed_from_step", str(step))  # visible proof of a resume in the UI

    def write(directory: Path, at: int, positions: list | None) -> None:
        write_checkpoint(directory, raw, optimizer, scheduler, vocab_text=vocab_text,
                         do_lower_case=config.checkpoint.do_lower_case, extra={
            "step": at, "world_size": world, "micro_batch_size": data.micro_batch_size, "accum": data.accum,
            "seed": rt.seed, "data_position": {"micro_batches_per_rank": at * data.accum,
                                               "packed_positions": positions,
                                               "dataset_config_hash": data.train.config_hash},
            "rng": "dropout: torch.manual_seed(sha256('dropout', seed, rank, step)) before each step; dynamic "
                   "masking: numpy Generator(sha256('remask', seed, rank, micro-batch index))",
            "mlflow_run_id": config.tracking.run_id, "run_name": config.tracking.run_name,
            "config": dataclasses.asdict(config),
        })
        if compile_model:
            compile_mod.save_artifacts(directory)

    warmup = rt.exclude_steps if rt.exclude_steps is not None else (rt.compile_warmup_steps if compile_model else 0)
    sums, window, totals = MetricSums(), Window(batches.wait_seconds, counting=warmup == 0), RunTotals()
    t_start, budget = time.perf_counter(), rt.max_seconds
    result = FitResult(step, {}, None, resumed_from)
    log_every, eval_every = config.tracking.log_every, config.eval.every if config.eval else 0
    try:
        while step < config.max_steps:
            micro = [to_device(next(batches), device) for _ in range(data.accum)]
            torch.manual_seed(seed_for("dropout", rt.seed, rank, step) % 2**63)
            out = train_step(model, optimizer, micro, scheduler=scheduler, max_grad_norm=opt_cfg.max_grad_norm,
                             autocast_dtype=autocast_dtype, sums=sums)
            step += 1
            if step == resumed_from + 1 and rank == 0:
                _log_first_step(device)
            if step - resumed_from == warmup and warmup:
                if device.type == "cuda":
                    torch.cuda.synchronize()  # the warm-up's (compiled) kernels must not leak into the window
                window.exclude(sums, batches.wait_seconds)
            last = step == config.max_steps
            metrics: dict[str, float] = {}
            if step % log_every == 0 or last:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - window.start
                time_up = float(bool(budget) and time.perf_counter() - t_start > budget)
                counted = window.counted(sums)
                both = MetricSums(torch.cat([sums.values, counted.values])).all_reduce().values
                total, counted = MetricSums(both[:len(both) // 2]), MetricSums(both[len(both) // 2:])
                host = _all_reduce_host(torch.tensor([batches.wait_seconds - window.wait0, elapsed, time_up],
                                                     dtype=torch.float64))
                if host[2] > 0 and not last:  # every rank sees the same sum, so all stop at this step
                    log.info("step %d: the --max-minutes budget is spent; finishing here", step)
                    last = True
                metrics = total.summary()
                metrics.update(learning_rate=float(out["learning_rate"]), grad_norm=float(out["grad_norm"]))
                if counted.sequences > 0:  # a window of warm-up steps only has no throughput to show
                    seconds, wait = float(host[1]) / world, float(host[0]) / world
                    metrics.update(throughput(counted, seconds, wait, raw.config, peak, world))
                    totals.add(counted, seconds, wait)
                sums, window = MetricSums(), Window(batches.wait_seconds, counting=step - resumed_from >= warmup)
            if eval_rows is not None and ((eval_every and step % eval_every == 0) or last):
                t_eval = time.perf_counter()
                ev = (to_device(b, device) for b in data_mod.eval_batches(
                    eval_rows, config.eval, data.micro_batch_size, rank, world, data.length_buckets))
                metrics.update(evaluate(raw, ev, autocast_dtype).all_reduce().summary(prefix="eval_"))
                window.pause(time.perf_counter() - t_eval)  # evaluation does not count against throughput
            if rank == 0 and metrics:
                log.info("step %d/%d %s", step, config.max_steps,
                         " ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
                tracker.log(metrics, step)
                result.history.append((step, metrics))
            if metrics:
                result.metrics = metrics
            if worker.checkpoints is not None and (step % config.checkpoint.every == 0 or last):
                at, positions = step, data_mod.gather_positions(batches)  # every rank takes part
                path = worker.checkpoints.save(step, metrics,
                                               (lambda d: write(d, at, positions)) if rank == 0 else None)
                result.checkpoint = path or result.checkpoint
            if last:
                break
        result.step = step
        result.throughput = totals.summary(raw.config, peak, world)
        if rank == 0 and result.throughput:
            # The run's figures (compile warm-up excluded), once, at the last step: what a GPU run reports as its
            # seq/s, MFU of real tokens and data wait.
            log.info("run throughput after warm-up: %s",
                     " ".join(f"{k}={v:.4g}" for k, v in sorted(result.throughput.items())))
            tracker.log({f"run_{k}": v for k, v in result.throughput.items()
                         if k in ("sequences_per_second", "tokens_per_second", "data_wait_fraction", "mfu",
                                  "hfu", "padding_fraction")}, step)
    finally:
        batches.close()
        tracker.close()
    return result
