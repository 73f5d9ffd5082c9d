"""Fine-tuning's loop, `fit(config, worker)`: the same shape and pieces as pre-training's `pretraining.loop.fit` (the
launcher's `training.worker.Worker`, the tracker, the optimizer step, checkpoints through `worker.checkpoints`).

The job prepares the task once, on the driver, where every check of the data runs (`finetuning.prepare`), and the
launcher hands the prepared task to every worker (`worker.inputs`: every rank holds the same rows); `fit` without
a job prepares it itself. Each worker builds the head model, trains, and evaluates every epoch. Every
rank walks the same seeded permutation and takes its strided share, padded so all ranks run the same number of
steps (an uneven count hangs DDP's all-reduce). Evaluation is sharded the same way; rank 0 gathers the per-row
outputs, scores them (``finetuning.evaluation``), logs the epoch and, when the main metric improved, writes the model
as the epoch's checkpoint (the launcher keeps the last one written: the best). Every rank calls
`worker.checkpoints.save` each epoch: under Ray it is a barrier.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from finetuning.evaluation import MAIN_METRIC, score
from finetuning.features import Features, collate_features
from finetuning.prepare import prepare
from finetuning.step import finetune_step
from finetuning.task_model import build_model, tokenizer_for
from tracking.tracker import NullTracker
from training.checkpoint import MODEL_DIR
from training.guard import TrainingDiverged, nonfinite_tensors
from training.optim import build_optimizer, build_scheduler
from training.progress import Progress
from training.worker import FitResult, Worker

if TYPE_CHECKING:
    from finetuning.config import FinetuneConfig

log = logging.getLogger(__name__)

BEST_METRICS_FILE = "eval_metrics.json"  # beside the model in a checkpoint: the epoch's evaluation
SLOW_ON_CPU = ("try a smaller model (--init of a smaller preset), fewer --epochs or --max-train-examples, or --use-gpu "
               "on a GPU machine")
LOG_EVERY = 50  # optimizer steps between progress lines (and MLflow train_loss_step points)


def rank_indices(n: int, world: int, rank: int, rng: np.random.Generator | None) -> np.ndarray:
    """This rank's rows: a (seeded) permutation padded by wrap-around to a multiple of ``world``, strided."""
    order = rng.permutation(n) if rng is not None else np.arange(n)
    pad = (-n) % world
    if pad:
        order = np.concatenate([order, order[:pad]])
    return order[rank::world]


def to_tensors(batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    out = {k: torch.from_numpy(v).to(device) for k, v in batch.items()}
    if "labels" in out and out["labels"].dtype == torch.float32:
        out["labels"] = out["labels"].float()
    return out


@torch.no_grad()
def predict(model: nn.Module, task: str, feats: Features, indices: np.ndarray, batch_size: int, pad_id: int,
            device: torch.device) -> list[np.ndarray]:
    """Per-row outputs (trimmed to the row's length) for ``indices``: logits, or start/end stacked for QA."""
    model.eval()
    outputs: list[np.ndarray] = []
    for b in range(0, len(indices), batch_size):
        idx = indices[b : b + batch_size]
        batch = collate_features(feats, idx, pad_id)
        batch = {k: v for k, v in batch.items() if k in ("input_ids", "token_type_ids", "attention_mask")}
        out = model(**to_tensors(batch, device))
        if task == "question_answering":
            logits = torch.stack([out.start_logits, out.end_logits], dim=-1)
        else:
            logits = out.logits
        logits = logits.float().cpu().numpy()
        for j, i in enumerate(idx):
            if task in ("token_classification", "question_answering"):
                outputs.append(logits[j, : len(feats.input_ids[i])])
            else:
                outputs.append(logits[j])
    return outputs


def gather_outputs(indices: np.ndarray, outputs: list[np.ndarray], n: int) -> list[np.ndarray] | None:
    """All ranks' outputs in row order on rank 0 (None elsewhere); padded duplicate rows are dropped."""
    pairs = list(zip(indices.tolist(), outputs, strict=False))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, pairs)
        if torch.distributed.get_rank() != 0:
            return None
        pairs = [p for part in gathered for p in part]
    by_row = dict(pairs)
    return [by_row[i] for i in range(n)]


def fit(config: FinetuneConfig, worker: Worker | None = None) -> FitResult:
    """Train `config.schedule.epochs` epochs and evaluate after each; the best epoch's model is the last checkpoint
    written. The same function runs in each Ray Train worker and in-process (`--no-ray`)."""
    worker = worker or Worker()
    rank, world = worker.rank, worker.world_size
    device = worker.device or torch.device("cpu")
    sched = config.schedule
    tokenizer, vocab_size = tokenizer_for(config.model)
    prepared = worker.inputs if worker.inputs is not None else prepare(config.data, tokenizer)
    task = prepared.task
    # Same seed on every rank for the weights (DDP also broadcasts rank 0's); a per-rank one for dropout.
    torch.manual_seed(config.seed)
    model = build_model(config.model, prepared, vocab_size)
    torch.manual_seed(config.seed + 1000 * rank)
    core = model.to(device)
    model = worker.wrap(model)
    tracker = worker.make_tracker() if rank == 0 else NullTracker()

    per_worker = max(1, sched.batch_size // world)
    n_train = len(prepared.train.features)
    steps_per_epoch = math.ceil(math.ceil(n_train / world) / per_worker)
    total = max(1, steps_per_epoch * sched.epochs)
    optimizer = build_optimizer(model, lr=sched.lr, weight_decay=sched.weight_decay)
    scheduler = build_scheduler(optimizer, int(sched.warmup_ratio * total), total)
    main_key = "eval_" + MAIN_METRIC[task]
    best = -math.inf
    eval_idx = rank_indices(len(prepared.eval.features), world, rank, None)
    result = FitResult(0, {}, None)
    progress = Progress(total, on_cpu=device.type == "cpu", slow_advice=SLOW_ON_CPU)
    # Rank 0 says where the run is at least once a minute, however long a step takes (training.progress).
    beat = progress.heartbeat(log.info) if rank == 0 else contextlib.nullcontext()

    def write(directory: Path, metrics: dict[str, float]) -> None:
        core.save_pretrained(directory / MODEL_DIR, vocab_file=tokenizer.vocab_file,
                             do_lower_case=tokenizer.do_lower_case)
        (directory / BEST_METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")

    beat.__enter__()  # (left in the `finally` below, which the loop already has)
    try:
        for epoch in range(1, sched.epochs + 1):
            t0 = time.perf_counter()
            idx = rank_indices(n_train, world, rank, np.random.default_rng([config.seed, epoch]))
            losses: list[torch.Tensor] = []  # on the device; read only when logged
            for b in range(0, len(idx), per_worker):
                batch = to_tensors(collate_features(prepared.train.features, idx[b : b + per_worker],
                                                    tokenizer.pad_id), device)
                losses.append(finetune_step(model, batch, optimizer, scheduler))
                step = (epoch - 1) * steps_per_epoch + len(losses)
                progress.advance(step=step)
                if rank == 0 and step % LOG_EVERY == 0:
                    # A non-finite loss (its update was skipped: training.step) shows as NaN, never hidden.
                    recent = float(torch.stack(losses[-LOG_EVERY:]).float().mean())
                    log.info("epoch %d/%d %s loss %.4f (%.1f examples/s)", epoch, sched.epochs,
                             progress.describe(step), recent,
                             min(b + per_worker, len(idx)) * world / (time.perf_counter() - t0))
                    tracker.log({"train_loss_step": recent}, step)
                if rank == 0:
                    for line in progress.notes(step):
                        log.info("epoch %d/%d %s", epoch, sched.epochs, line)
            train_s = time.perf_counter() - t0
            outputs = predict(core, task, prepared.eval.features, eval_idx, sched.eval_batch_size, tokenizer.pad_id,
                              device)
            gathered = gather_outputs(eval_idx, outputs, len(prepared.eval.features))
            metrics: dict[str, float] = {"epoch": epoch}
            improved = False
            if rank == 0:
                scores = score(task, prepared.eval, prepared.label_map, gathered, sched.max_answer_length)
                metrics.update({f"eval_{k}": v for k, v in scores.items()})
                stacked = torch.stack(losses).float() if losses else torch.full((1,), math.nan)
                metrics.update(train_loss=float(stacked.mean()),
                               train_nonfinite_steps=float((~torch.isfinite(stacked)).sum()) if losses else 0.0,
                               train_seconds=train_s, train_examples_per_s=len(idx) * world / max(train_s, 1e-9),
                               epoch_seconds=time.perf_counter() - t0, lr=float(scheduler.get_last_lr()[0]))
                tracker.log({k: v for k, v in metrics.items() if k != "epoch"}, epoch)
                log.info("epoch %d/%d done, %s: %s", epoch, sched.epochs,
                         progress.describe(epoch * steps_per_epoch),
                         {k: float(f"{v:.4g}") for k, v in metrics.items()})
                value = metrics[main_key]
                improved = not math.isnan(value) and (value > best or best == -math.inf)
                if improved:
                    bad = nonfinite_tensors(core.state_dict().items())
                    if bad:  # never a non-finite checkpoint, even one whose metric looks fine
                        raise TrainingDiverged(f"epoch {epoch}: the weights hold NaN or inf ({', '.join(bad[:3])}); "
                                               f"try a lower --lr (now {sched.lr:g})")
                    best = value
                result.history.append((epoch, metrics))
            if worker.checkpoints is not None:
                saving = (lambda d, m=metrics: write(d, m)) if improved else None
                saved = worker.checkpoints.save(epoch, metrics, saving)
                result.checkpoint = saved or result.checkpoint
            if improved:
                result.metrics = metrics
            result.step = epoch * steps_per_epoch
    finally:
        beat.__exit__(None, None, None)
        tracker.close()
    return result
