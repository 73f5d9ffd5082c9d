"""`fit(config)`: the whole pre-training loop in one process. `_fit` reads as its parts: set-up (build or resume the
model, stream this rank's batches), the step loop (step; at log steps the window's reduction and the log line with
progress and ETA; the guard's review, which may roll back; evaluation; checkpoint writing). Runs without Ray on a
CPU or one GPU; the Ray Train worker (`training.launch.ray_worker`) calls the same function with its rank, DDP wrapper,
checkpoint hooks and row source.

Reproducibility on resume, on any number of workers: the data order is global (`pretraining.order`: step k trains
on the same examples whatever the world size; each rank takes its share and accumulation absorbs the rest), the
data position is the step plus the batches rollbacks skipped (a packed stream: its (window, batch) position), the
loss is the mean over the global batch, dropout is re-seeded before each micro-batch from (seed, step, the
micro-batch's first row in the global batch), and dynamic masking is keyed by example. So a resumed run replays
exactly the batches and random draws of an uninterrupted one, and a run resumed on another world size (an elastic
run that Ray Train resized) trains the same examples per step; the resize is logged and tagged.

Nothing in a step reads a device value on the host: metrics stay in `MetricSums` on the device and are reduced
across ranks and read only every `log_every` steps (and at the end); the guard's per-step records are read at the
same steps and before each checkpoint (`training.guard`: a non-finite step is skipped on the device, a run of them
or a loss spike rolls back to the last checkpoint past the offending batches, and a run that keeps diverging raises
`TrainingDiverged`). A rollback restores the weights and optimizer but not the stream, which goes on past every
batch seen: the skipped count (checkpointed) keeps the step and the data position apart.
"""
from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import torch

from corpus.rng import derive_seed as seed_for
from pretraining import compile as compile_mod
from pretraining import kernel_options, memory, order, recovery
from pretraining import loader as data_mod
from pretraining.config import PretrainConfig
from pretraining.metrics import MetricSums
from pretraining.perf import Window, peak_flops, throughput
from pretraining.run_state import LoopState, TrainRun, all_reduce_host, build_model, host_group
from pretraining.step import evaluate, train_step
from tracking.tracker import NullTracker
from training.checkpoint import load_train_state
from training.guard import (
    Guard,
)
from training.optim import build_optimizer, build_scheduler
from training.progress import Progress
from training.step import to_device
from training.worker import FitResult, Worker, resolve_device

log = logging.getLogger(__name__)


def _read_vocab(config: PretrainConfig) -> str | None:
    if not config.checkpoint.vocab_url:
        return None
    from storage.fs import read_bytes

    return read_bytes(config.checkpoint.vocab_url, config.data.endpoint_url).decode("utf-8")


STOPPED_TAG = "stopped_by"  # the run's tag when the wall-clock budget or a signal ended it before --max-steps
SLOWED_TAG = "slowed_by"  # the run's tag when the machine's load made it slow (training.progress.machine_note)
SLOW_ON_CPU = "try a smaller --preset (bert_tiny, bert_mini), fewer --max-steps, or --use-gpu on a GPU machine"


def _log_first_step(device: torch.device) -> None:
    """How long a (re)start took to its first step: the fast-restart figure (compile caches, present buckets)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    age = compile_mod.process_age()
    if age is not None:
        log.info("first step done %.1f s after the process started", age)


def fit(config: PretrainConfig, worker: Worker | None = None) -> FitResult:
    """Train for `config.max_steps` steps (or until the --max-minutes budget), resuming from the latest checkpoint.
    Raises `TrainingDiverged` when the run keeps diverging after the guard's rollbacks."""
    worker = worker or Worker()
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
    """Set-up, then the step loop: step; at log steps the window's reduction; at log and checkpoint steps the
    guard's review (a divergence rolls back); evaluation; logging; checkpoint writing."""
    run = _set_up(config, worker, device)
    result = FitResult(run.loop.step, {}, None, run.resumed_from)
    log_every, eval_every = config.tracking.log_every, config.eval.every if config.eval else 0
    # Rank 0 says where the run is at least once a minute, however long a step takes (training.progress).
    beat = run.progress.heartbeat(log.info) if worker.rank == 0 else contextlib.nullcontext()
    try:
        with beat, kernel_options.kernel_faults(run.raw, device, "during training"):
            _steps(run, result, log_every, eval_every)
    finally:
        if run.batches is not None:
            run.batches.close()
        run.tracker.close()
    return result


def _steps(run: TrainRun, result: FitResult, log_every: int, eval_every: int) -> None:
    """The step loop of `_fit` (which turns a GPU kernel's error into a `KernelFault`)."""
    config, worker = run.config, run.worker
    while run.loop.step < config.max_steps:
        out = _train_step(run)
        last = run.loop.step == config.max_steps
        if not last:
            stop = _stop_now(run)  # every step: a spent --max-minutes budget, or Ctrl-C / SIGTERM
            if stop:
                log.info("step %d: stopped by %s; finishing here after a checkpoint", run.loop.step, stop)
                run.tracker.set_tag(STOPPED_TAG, f"{stop} at step {run.loop.step} of {config.max_steps}")
                last = True
        metrics: dict[str, float] = {}
        if run.loop.step % log_every == 0 or last:
            metrics, _ = _reduce_window(run, out)
        save = worker.checkpoints is not None and (run.loop.step % config.checkpoint.every == 0 or last)
        if metrics or save:
            divergence = run.guard.review(*run.loop.step_log.read())
            if divergence is None and save:
                divergence = recovery.nonfinite_state(run)
            if divergence is not None:
                if not metrics:  # a checkpoint's review: the window that diverged is logged all the same
                    metrics, _ = _reduce_window(run, out)
                recovery.roll_back(run, divergence, lambda at, m=metrics: _record(  # or raises TrainingDiverged
                    run, result, {**m, **run.guard.window_metrics()}, at))  # the counters after the verdict
                _new_window(run)  # the stream goes on: its position is already past every batch seen since then
                continue
            run.loop.seen.clear()  # reviewed: none of these batches will be skipped
            if metrics:
                metrics.update(run.guard.window_metrics())
        if run.eval_rows is not None and ((eval_every and run.loop.step % eval_every == 0) or last):
            metrics.update(_evaluate(run))
        if metrics:
            _record(run, result, metrics)
        if save:
            recovery.save_checkpoint(run, result, metrics, last)
        if worker.rank == 0:
            for line in run.progress.notes(run.loop.step):
                log.info("%s", line)
        if last:
            break
    result.step = run.loop.step
    result.throughput = run.loop.totals.summary(run.raw.config, run.peak, worker.world_size)
    slow = run.progress.machine_note() if worker.rank == 0 else None
    if slow:  # the closing summary names the cause of a slow run, when it was the machine
        log.warning("%s", slow)
        run.tracker.set_tag(SLOWED_TAG, slow)
    if worker.rank == 0 and result.throughput:
        # The run's figures (compile warm-up excluded), once, at the last step: what a GPU run reports as its
        # seq/s, MFU of real tokens and data wait.
        log.info("run throughput after warm-up: %s",
                 " ".join(f"{k}={v:.4g}" for k, v in sorted(result.throughput.items())))
        run.tracker.log({f"run_{k}": v for k, v in result.throughput.items()
                         if k in ("sequences_per_second", "tokens_per_second", "data_wait_fraction", "mfu",
                                  "hfu", "padding_fraction")}, run.loop.step)


# ---- set-up ------------------------------------------------------------------------------------------------------

def _set_up(config: PretrainConfig, worker: Worker, device: torch.device) -> TrainRun:
    """The model, optimizer and schedule (from the latest checkpoint when there is one), compiled if asked, and
    this rank's batches from the data position; the tracker on rank 0."""
    rt, opt_cfg = config.runtime, config.optimizer
    data = config.data.for_world(worker.world_size)  # this world's micro-batch and accumulation; the same order
    bf16 = rt.precision == "bf16" or (rt.precision == "auto" and device.type == "cuda")
    autocast_dtype = torch.bfloat16 if bf16 else None
    compile_model = rt.compile if rt.compile is not None else device.type == "cuda"
    _check_memory(config, data, worker, device)
    guard = Guard(config.guard)
    step, packed_position, resized = 0, None, None
    latest = worker.checkpoints.latest() if worker.checkpoints is not None else contextlib.nullcontext(None)
    with latest as ckpt_dir:
        ckpt_dir = Path(ckpt_dir) if ckpt_dir is not None else None
        raw = build_model(config, ckpt_dir).to(device)
        kernel_options.apply(raw, rt.fused_kernels, rt.low_precision_residual)
        # Where the fused kernels run (CUDA by default), each is checked once against the composition at this
        # run's largest micro-batch and switched off if it disagrees; no global RNG is drawn.
        kernel_options.check(raw, device, data.micro_batch_size * data.length_buckets[-1])
        raw.train()
        optimizer = build_optimizer(raw, opt_cfg.name, lr=opt_cfg.lr, weight_decay=opt_cfg.weight_decay,
                                    fused=True if device.type == "cuda" and opt_cfg.name == "adamw" else None)
        scheduler = build_scheduler(optimizer, opt_cfg.warmup_steps, config.max_steps, decay=opt_cfg.decay,
                                    power=opt_cfg.poly_power)
        initial = None if ckpt_dir is not None else (optimizer.state_dict(), scheduler.state_dict())
        if ckpt_dir is not None:
            state = load_train_state(ckpt_dir, optimizer, scheduler)
            step = int(state["step"])
            guard.load_state_dict(state.get("guard", {}))
            packed_position, resized = _resume_position(state, data, rt.seed, worker)
            if worker.rank == 0:
                log.info("resumed from %s at step %d", ckpt_dir, step)

    model = worker.wrap(raw)
    if compile_model:
        compile_mod.private_inductor_cache()  # before anything compiles: torch's default is under the shared /tmp
        if rt.compile_cache is not None:  # the operator's trusted folder; never the checkpoint's (shared storage)
            compile_mod.load_artifacts(rt.compile_cache, compile_mod.compile_key(rt, data, raw.config, device))
        model = compile_mod.compile_model(model, rt, data, device)
        if rt.precompile_buckets:  # the fused kernels' first build inside Inductor's graphs: a fault is the verdict
            with kernel_options.kernel_faults(raw, device, "while precompiling"):
                compile_mod.precompile(model, data, raw.config.vocab_size, device, autocast_dtype)
    tracker = NullTracker()
    if worker.rank == 0:
        tracker = worker.make_tracker(config.tracking.system_metrics)
    if step:
        tracker.set_tag("resumed_from_step", str(step))  # visible proof of a resume in the UI
    if resized:
        tracker.set_tag(f"resize.step_{step}", resized)
    # The geometry of this (re)start, charted (and at every log step): an elastic run's resizes show as steps.
    tracker.log(_geometry(worker, data), step)
    warmup = rt.exclude_steps if rt.exclude_steps is not None else (rt.compile_warmup_steps if compile_model else 0)
    # The data position: every step so far plus the batches rollbacks skipped (a packed stream: its own position).
    batches = data_mod.train_steps(data, raw.config.vocab_size, rt.seed, worker.rank, worker.world_size,
                                   step + guard.skipped_batches, pin_memory=device.type == "cuda",
                                   start_position=packed_position)
    run = TrainRun(config=config, worker=worker, device=device, raw=raw, model=model, optimizer=optimizer,
                   scheduler=scheduler, initial_state=initial, autocast_dtype=autocast_dtype, resumed_from=step,
                   guard=guard, tracker=tracker,
                   progress=Progress(config.max_steps, rt.max_seconds, on_cpu=device.type == "cpu",
                                     slow_advice=SLOW_ON_CPU, first_step=step, cpus=torch.get_num_threads()),
                   vocab_text=_read_vocab(config) if worker.rank == 0 else None,
                   peak=peak_flops(device, rt.peak_flops),
                   eval_rows=(data_mod.eval_rows(config.eval, config.data.endpoint_url) if config.eval is not None
                              else None),
                   warmup=warmup, compiled=compile_model, data=data, batches=batches,
                   loop=LoopState(step=step, position=packed_position), host_group=host_group())
    _new_window(run)
    return run


def _resume_position(state: dict, data: data_mod.DataConfig, seed: int, worker: Worker,
                     ) -> tuple[tuple[int, int] | None, str | None]:
    """The packed stream's position from a checkpoint (None: not packed, or not saved), and a line saying how the
    world size changed since it was written (None: it did not). A checkpoint of another data order (dataset,
    batch, seed, bucketing or packing changed) is warned about: training continues, on other examples per step."""
    position = state["data_position"]
    if position.get("order") != order.order_key(data, seed) and worker.rank == 0:
        log.warning("resuming with another data order than the checkpoint's (the dataset, --batch-size, --seed, "
                    "bucketing or packing changed): training continues, but not on the examples the original run "
                    "would have trained at each step")
    packed = position.get("packed_position")
    resized = None
    if state["world_size"] != worker.world_size:
        resized = (f"step {state['step']}: {state['world_size']} -> {worker.world_size} workers, accumulation "
                   f"{state['accum']} -> {data.accum}, micro-batch {state['micro_batch_size']} -> "
                   f"{data.micro_batch_size} (global batch {data.batch_size}, the same data order)")
        if worker.rank == 0:
            log.info("resized at %s", resized)
    return (tuple(packed) if packed else None), resized


def _check_memory(config: PretrainConfig, data: data_mod.DataConfig, worker: Worker, device: torch.device) -> None:
    """Fail in seconds, naming the flag, when this world's micro-batch cannot fit in this worker's memory (the
    smallest budget of all ranks, so every rank reaches the same verdict)."""
    budget = (int(config.memory.budget_gb * memory.GIB) if config.memory.budget_gb else
              memory.available_bytes(device, worker.local_world_size))
    budget = int(all_reduce_host(torch.tensor([float(budget)], dtype=torch.float64), op="min")[0])
    est = memory.check(config.model.bert, data.micro_batch_size, data.length_buckets[-1], data.train.max_predictions,
                       budget, device.type, per_rank_batch=data.micro_batch_size * data.accum)
    if worker.rank == 0:
        log.info("memory: a step of %d x %d tokens needs ~%s of the %s free per worker", data.micro_batch_size,
                 data.length_buckets[-1], est.describe(), memory.gib(budget))


def _new_window(run: TrainRun) -> None:
    run.loop.sums = MetricSums()
    run.loop.window = Window(run.batches.wait_seconds, counting=run.loop.executed >= run.warmup)


# ---- the step and its window -------------------------------------------------------------------------------------

def _train_step(run: TrainRun) -> dict:
    rt = run.config.runtime
    share = next(run.batches)
    micro = [to_device(batch, run.device) for batch in share.micro]
    out = train_step(run.model, run.optimizer, micro, scheduler=run.scheduler,
                     max_grad_norm=run.config.optimizer.max_grad_norm, autocast_dtype=run.autocast_dtype,
                     sums=run.loop.sums, totals=share.batch.totals, world=run.worker.world_size,
                     seeds=[seed_for("dropout", rt.seed, run.loop.step, first) for first in share.starts])
    run.loop.position = share.batch.position
    run.loop.seen[run.loop.step + 1] = share.batch.examples  # named by the guard if this step's batch is skipped
    if run.worker.rank == 0:
        run.loop.digests[run.loop.step + 1] = order.digest(share.batch.examples)
    run.loop.step += 1
    run.loop.executed += 1
    if run.loop.executed == 1 and run.worker.rank == 0:
        _log_first_step(run.device)
    run.progress.advance(step=run.loop.step)
    run.loop.step_log.add(run.loop.step, out["loss"], out["finite"])
    if run.loop.executed == run.warmup:
        if run.device.type == "cuda":
            torch.cuda.synchronize()  # the warm-up's (compiled) kernels must not leak into the window
        run.loop.window.exclude(run.loop.sums, run.batches.wait_seconds)
    return out


def _stop_now(run: TrainRun) -> str | None:
    """Why the run stops at this step boundary ("--max-minutes": its budget is spent; "SIGINT": a signal asked it
    to), the same verdict on every rank (one small host collective per step with several ranks); None: it goes on."""
    budget = run.config.runtime.max_seconds
    time_up = bool(budget) and time.perf_counter() - run.t_start > budget
    signal = run.worker.stop()
    if run.worker.world_size > 1:
        both = all_reduce_host(torch.tensor([float(time_up), float(signal is not None)], dtype=torch.float64),
                               group=run.host_group)
        time_up, signal = bool(both[0] > 0), (signal or "a stop request") if both[1] > 0 else None
    return signal or ("--max-minutes" if time_up else None)


def _reduce_window(run: TrainRun, out: dict) -> tuple[dict[str, float], bool]:
    """The log window's metrics, summed over ranks (one collective), and whether the time budget is spent."""
    world = run.worker.world_size
    if run.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - run.loop.window.start
    budget = run.config.runtime.max_seconds
    time_up = float(bool(budget) and time.perf_counter() - run.t_start > budget)
    counted = run.loop.window.counted(run.loop.sums)
    both = MetricSums(torch.cat([run.loop.sums.values, counted.values])).all_reduce().values
    total, counted = MetricSums(both[:len(both) // 2]), MetricSums(both[len(both) // 2:])
    host = all_reduce_host(torch.tensor([run.batches.wait_seconds - run.loop.window.wait0, elapsed, time_up],
                                         dtype=torch.float64))
    metrics = total.summary()
    metrics.update(learning_rate=float(out["learning_rate"]), grad_norm=float(out["grad_norm"]),
                   nonfinite_batches=total.nonfinite, **_geometry(run.worker, run.data))
    if counted.sequences > 0:  # a window of warm-up steps only has no throughput to show
        seconds, wait = float(host[1]) / world, float(host[0]) / world
        metrics.update(throughput(counted, seconds, wait, run.raw.config, run.peak, world))
        run.loop.totals.add(counted, seconds, wait)
    _new_window(run)
    return metrics, host[2] > 0


def _evaluate(run: TrainRun) -> dict[str, float]:
    cfg, data = run.config, run.data
    t_eval = time.perf_counter()
    counts: list[torch.Tensor] = []  # the eval labels' token counts: the most frequent token's share is the
    #                                   accuracy of a model that always predicts it (what a stuck MLM scores)
    predicted: list[torch.Tensor] = []  # the predictions' counts: one token predicted everywhere is a collapse

    def counted(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        labels = torch.as_tensor(batch["masked_lm_labels"])
        counts.append(torch.bincount(labels[labels >= 0].reshape(-1)))
        return batch

    def seen(out, batch: dict[str, torch.Tensor]) -> None:
        if out.mlm_logits is not None:
            top = out.mlm_logits.argmax(-1)
            if top.dim() == 2:  # every slot (B, P): the padding slots' rows mean nothing
                top = top[batch["masked_lm_labels"] >= 0]
            predicted.append(torch.bincount(top.reshape(-1).cpu()))

    batches = (to_device(counted(b), run.device) for b in data_mod.eval_batches(
        run.eval_rows, cfg.eval, data.micro_batch_size, run.worker.rank, run.worker.world_size, data.length_buckets))
    metrics = evaluate(run.raw, batches, run.autocast_dtype, on_output=seen).all_reduce().summary(prefix="eval_")
    if counts and run.worker.world_size == 1:  # (with several ranks each sees a part; the shares are left out)
        metrics["eval_mlm_top_token_share"] = _top_share(counts)
        if predicted:
            metrics["eval_mlm_predicted_top_share"] = _top_share(predicted)
    run.loop.window.pause(time.perf_counter() - t_eval)  # evaluation does not count against throughput
    return metrics


def _top_share(counts: list[torch.Tensor]) -> float:
    """The most frequent id's share of all the counts (bincounts of any lengths)."""
    total = torch.zeros(max(len(c) for c in counts), dtype=torch.int64)
    for c in counts:
        total[:len(c)] += c
    return float(total.max() / total.sum())


QUIET_WHEN_ZERO = ("nonfinite_batches", "nonfinite_steps", "loss_spikes", "rollbacks", "skipped_batches")
GEOMETRY = ("world_size", "grad_accumulation_steps", "micro_batch_size")  # charted, not in the log line


def _geometry(worker: Worker, data: data_mod.DataConfig) -> dict[str, float]:
    return dict(zip(GEOMETRY, (worker.world_size, data.accum, data.micro_batch_size), strict=False))


def _record(run: TrainRun, result: FitResult, metrics: dict[str, float], step: int | None = None) -> None:
    """Log line and tracker on rank 0 (the guard's counters always go to the tracker, into the line when not 0)."""
    step = run.loop.step if step is None else step
    if run.worker.rank == 0:
        shown = {k: v for k, v in metrics.items() if not (k in QUIET_WHEN_ZERO and v == 0) and k not in GEOMETRY}
        log.info("%s %s", run.progress.describe(step), " ".join(f"{k}={v:.4g}" for k, v in sorted(shown.items())))
        run.tracker.log(metrics, step)
        result.history.append((step, metrics))
    result.metrics = metrics
