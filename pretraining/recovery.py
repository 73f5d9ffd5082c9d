"""Recovery: what the step loop does to keep a run's checkpoints good and to come back from a divergence. A
checkpoint is written only while the guard sees no run of bad steps (``save_checkpoint``, with the data position
and the digests of the batches trained since the previous one); a weight or optimizer tensor holding a NaN or inf
is a divergence (``nonfinite_state``); a divergence rolls the weights, optimizer and schedule back to the last
checkpoint or the initial weights, skipping the batches since (``roll_back``, ``restore``), naming the examples of
the batch that diverged (``examples_of``), or gives up with ``TrainingDiverged``."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from bert_core import BertForPreTraining
from pretraining import compile as compile_mod
from pretraining import order
from pretraining.run_state import TrainRun, all_reduce_host, build_model
from training.checkpoint import load_train_state, write_checkpoint
from training.guard import Divergence, TrainingDiverged, advice, model_and_optimizer_tensors, nonfinite_tensors
from training.worker import FitResult

log = logging.getLogger(__name__)


def nonfinite_state(run: TrainRun) -> Divergence | None:
    """A divergence when a weight or optimizer tensor holds a NaN or inf (the same verdict on every rank)."""
    bad = nonfinite_tensors(model_and_optimizer_tensors(run.raw, run.optimizer))
    if not int(all_reduce_host(torch.tensor([float(len(bad))]))[0]):
        return None
    return Divergence(run.loop.step, f"NaN or inf in {len(bad)} weight or optimizer tensors ({', '.join(bad[:3])}...)")


def roll_back(run: TrainRun, divergence: Divergence, record: Callable[[int], None]) -> None:
    """Back to the last checkpoint (or the initial weights), the batches since then skipped; or give up. Either way
    the window that diverged is logged (``record(step)``: the loop's log line and tracker, at the step it diverged)
    with the guard's counters after the verdict; the caller starts a new window once the run is back."""
    cfg, opt = run.config, run.config.optimizer
    tips = advice(opt.lr, opt.max_grad_norm, opt.warmup_steps, cfg.model.bert.hidden_size)
    at = run.loop.step
    culprit = examples_of(run, divergence.step)
    run.loop.seen.clear()
    run.loop.digests.clear()  # the steps after the checkpoint rolled back to will be trained again, on other batches

    if run.guard.rollbacks >= cfg.guard.max_rollbacks:
        record(at)
        message = (f"training diverged at step {divergence.step}: {divergence.reason}, after {run.guard.rollbacks} "
                   f"rollbacks that skipped {run.guard.skipped_batches} steps' batches; {culprit}; {tips}")
        run.tracker.set_tag("guard.diverged", message[:5000])
        raise TrainingDiverged(message)
    latest = run.worker.checkpoints.latest() if run.worker.checkpoints is not None else contextlib.nullcontext(None)
    with latest as ckpt_dir:
        restore(run, Path(ckpt_dir) if ckpt_dir is not None else None)
    run.guard.rolled_back(run.loop.step, at)
    what = (f"step {divergence.step}: {divergence.reason}; rolled back to step {run.loop.step} "
            f"({'its checkpoint' if run.loop.step else 'the initial weights'}), skipping the batches of steps "
            f"{run.loop.step + 1}-{at} (rollback {run.guard.rollbacks} of at most {cfg.guard.max_rollbacks}); "
            f"{culprit}")
    if run.worker.rank == 0:
        log.warning("%s", what)
    run.tracker.set_tag(f"guard.rollback.{run.guard.rollbacks}", what[:5000])
    record(at)
    run.tracker.rewind(run.loop.step)


def examples_of(run: TrainRun, step: int) -> str:
    """The examples of a step's global batch, named for the log (spike forensics). Called before the rollback is
    counted: the batch's number in the data order is the step plus the batches earlier rollbacks skipped."""
    ids, batch = run.loop.seen.get(step), step + run.guard.skipped_batches
    name = (run.worker.tracking.run_name if run.worker.tracking else "") or "RUN"
    replay = f"`python -m pretraining.batches --run STORAGE/{name} --step {batch} --text`"
    if ids is None:
        return f"step {step}'s batch (batch {batch} of the data order): {replay} prints it"
    return (f"step {step}'s batch was the examples (shard:row) {order.describe(ids)}, digest {order.digest(ids)} "
            f"({replay} prints them)")


def restore(run: TrainRun, ckpt_dir: Path | None) -> None:
    """Weights, optimizer and schedule from `ckpt_dir`, or as a fresh run starts them; in place, so the wrapped and
    compiled model keeps its parameters. The guard's counters stay (they count the whole run)."""
    if ckpt_dir is not None:
        source = BertForPreTraining.from_pretrained(ckpt_dir / "model")
        state = load_train_state(ckpt_dir, run.optimizer, run.scheduler)
        run.loop.step = int(state["step"])
    elif run.initial_state is not None:
        source = build_model(run.config, None)
        run.optimizer.load_state_dict(run.initial_state[0])
        run.scheduler.load_state_dict(run.initial_state[1])
        run.loop.step = 0
    else:
        raise AssertionError("a resumed run always has a checkpoint to roll back to")
    with torch.no_grad():
        run.raw.load_state_dict(source.state_dict())
    run.raw.train()


def save_checkpoint(run: TrainRun, result: FitResult, metrics: dict[str, float], last: bool) -> None:
    """Write a checkpoint (rank 0; every rank calls `save`: under Ray it is a barrier). An intermediate one waits
    while the guard has a run of bad steps open; the last one is written anyway (its weights are finite)."""
    if run.guard.open and not last:
        if run.worker.rank == 0:
            log.warning("step %d: checkpoint deferred while the loss is non-finite or spiking", run.loop.step)
        return
    cfg, data, rt, at = run.config, run.data, run.config.runtime, run.loop.step
    digests, run.loop.digests = run.loop.digests, {}

    def write(directory: Path) -> None:
        write_checkpoint(directory, run.raw, run.optimizer, run.scheduler, vocab_text=run.vocab_text,
                         do_lower_case=cfg.checkpoint.do_lower_case, extra={
            "step": at, "world_size": run.worker.world_size, "micro_batch_size": data.micro_batch_size,
            "accum": data.accum, "seed": rt.seed,
            # The position in the global order (pretraining.order), the same for every rank and world size.
            "data_position": {"global_batches": at + run.guard.skipped_batches,
                              "skipped_batches": run.guard.skipped_batches,
                              "packed_position": (list(run.loop.position) if data.packing and run.loop.position
                                                  else None),
                              "batch_size": data.batch_size, "order": order.order_key(data, rt.seed),
                              "dataset_config_hash": data.train.config_hash},
            # What these weights were trained on since the previous checkpoint: each step's batch digest, as
            # `python -m pretraining.batches` prints it (an elastic run's checkpoints together hold every step).
            "data_digests": {str(k): v for k, v in sorted(digests.items())},
            "guard": run.guard.state_dict(),
            "rng": "dropout: torch.manual_seed(blake2b('dropout', seed, step, the micro-batch's first row in the "
                   "global batch)) before each micro-batch; dynamic masking: keyed by (seed, example id, epoch)",
            "mlflow_run_id": run.worker.tracking.run_id if run.worker.tracking else None,
            "run_name": run.worker.tracking.run_name if run.worker.tracking else "",
            "config": dataclasses.asdict(cfg),
        })

    path = run.worker.checkpoints.save(at, metrics, write if run.worker.rank == 0 else None)
    if run.compiled and rt.compile_cache is not None and run.worker.rank == 0:
        compile_mod.save_artifacts(rt.compile_cache, compile_mod.compile_key(rt, data, run.raw.config, run.device))
    result.checkpoint = path or result.checkpoint
