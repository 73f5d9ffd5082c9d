"""Fine-tuning's loop: build the head model, train (DDP under Ray, or one process), evaluate every epoch.

Data travels as plain featurised rows (task files are small): every rank walks the same seeded permutation and
takes its strided share, padded so all ranks run the same number of steps (an uneven count hangs DDP's
all-reduce). Evaluation is sharded the same way; rank 0 gathers the per-row outputs, scores them with
``finetuning.evaluation``, logs the epoch to the job's single MLflow run (through the shared tracker) and,
when the main metric improved, reports the model as the checkpoint (only the best one is kept). Every rank calls
``report`` each epoch: under Ray it is a barrier.

``fit`` knows nothing of Ray: ``training.launch.finetune_worker`` hands it Ray's rank, device, DDP wrapper and
report; ``jobs/finetune.py --no-ray`` hands it rank 0 of 1 in the driver process. The optimizer step is the one
pre-training uses (``training.step``).
"""
from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bert_core.config import PRESETS, BertConfig
from bert_core.finetuning import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from training.optim import build_optimizer, build_scheduler
from finetuning.evaluation import MAIN_METRIC, score
from finetuning.features import Features, collate
from finetuning.prepare import PreparedTask
from training.config import TrackingConfig
from training.step import finetune_step
from training.tracking import NullTracker, make_tracker

log = logging.getLogger(__name__)

HEADS = {
    "classification": BertForSequenceClassification,
    "pair_classification": BertForSequenceClassification,
    "regression": BertForSequenceClassification,
    "token_classification": BertForTokenClassification,
    "question_answering": BertForQuestionAnswering,
}
BEST_METRICS_FILE = "eval_metrics.json"
LOG_EVERY = 50  # optimizer steps between progress lines (and MLflow train_loss_step points)


@dataclass(frozen=True)
class FinetuneLoopConfig:
    """What every worker needs, as plain values (the prepared data travels separately)."""

    init: str  # a model directory, or "random"
    vocab_size: int
    pad_id: int
    preset: str | None = None
    vocab_file: str | None = None
    do_lower_case: bool = True
    seed: int = 42
    epochs: int = 3
    lr: float = 5e-5
    batch_size: int = 32  # global
    eval_batch_size: int = 64
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_answer_length: int = 30
    threads_per_worker: int = 1
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.eval_batch_size < 1 or self.threads_per_worker < 1:
            raise ValueError("epochs, batch sizes and threads per worker must be >= 1")


def head_overrides(prepared: PreparedTask) -> dict[str, Any]:
    """Config fields of the head: the label map goes into config.json (HF's id2label/label2id)."""
    if prepared.task == "regression":
        return {"num_labels": 1, "id2label": {0: "LABEL_0"}, "problem_type": "regression"}
    if prepared.task == "question_answering":
        return {}
    over = {"num_labels": len(prepared.label_map), "id2label": prepared.label_map.id2label,
            "label2id": prepared.label_map.label2id}
    if prepared.task != "token_classification":
        over["problem_type"] = "single_label_classification"
    return over


def build_model(task: str, init: str, preset: str | None, vocab_size: int, overrides: dict[str, Any]) -> nn.Module:
    """The task's head on weights from ``init`` (an HF dir or our checkpoint; the head is new) or random."""
    cls = HEADS[task]
    if init == "random":
        if preset in PRESETS:
            return cls(PRESETS[preset](vocab_size=vocab_size, **overrides))
        # A model directory as the preset: its architecture, fresh weights (e.g. MiniLM's shape from scratch).
        base = BertConfig.from_json_file(Path(preset) / "config.json").replace(vocab_size=vocab_size)
        return cls(base.replace(**overrides))
    return cls.from_pretrained(init, **overrides)


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
        batch = collate(feats, idx, pad_id)
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
    pairs = list(zip(indices.tolist(), outputs))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, pairs)
        if torch.distributed.get_rank() != 0:
            return None
        pairs = [p for part in gathered for p in part]
    by_row = dict(pairs)
    return [by_row[i] for i in range(n)]


def fit(cfg: FinetuneLoopConfig, prepared: PreparedTask, rank: int, world: int, device: torch.device,
        report: Callable[[dict[str, float], str | None], None],
        wrap: Callable[[nn.Module], nn.Module] = lambda m: m) -> None:
    """Train and evaluate every epoch; ``report(metrics, best_model_dir_or_None)`` once per epoch on every rank.

    The same function runs under Ray Train (``wrap`` = DDP via ``prepare_model``) and in-process (``--no-ray``)."""
    torch.set_num_threads(cfg.threads_per_worker)
    task = prepared.task
    # Same seed on every rank for the weights (DDP also broadcasts rank 0's); a per-rank one for dropout.
    torch.manual_seed(cfg.seed)
    model = build_model(task, cfg.init, cfg.preset, cfg.vocab_size, head_overrides(prepared))
    torch.manual_seed(cfg.seed + 1000 * rank)
    core = model.to(device)
    model = wrap(model)
    tracker = make_tracker(cfg.tracking.tracking_uri, cfg.tracking.run_id) if rank == 0 else NullTracker()

    per_worker = max(1, cfg.batch_size // world)
    n_train = len(prepared.train.features)
    steps_per_epoch = math.ceil(math.ceil(n_train / world) / per_worker)
    total = max(1, steps_per_epoch * cfg.epochs)
    optimizer = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = build_scheduler(optimizer, int(cfg.warmup_ratio * total), total)
    main_key = "eval_" + MAIN_METRIC[task]
    best = -math.inf
    eval_idx = rank_indices(len(prepared.eval.features), world, rank, None)
    try:
        for epoch in range(1, cfg.epochs + 1):
            t0 = time.perf_counter()
            idx = rank_indices(n_train, world, rank, np.random.default_rng([cfg.seed, epoch]))
            losses: list[torch.Tensor] = []  # on the device; read only when logged
            for b in range(0, len(idx), per_worker):
                batch = to_tensors(collate(prepared.train.features, idx[b : b + per_worker], cfg.pad_id), device)
                losses.append(finetune_step(model, batch, optimizer, scheduler))
                step = (epoch - 1) * steps_per_epoch + len(losses)
                if rank == 0 and step % LOG_EVERY == 0:
                    recent = float(torch.stack(losses[-LOG_EVERY:]).float().mean())
                    log.info("epoch %d step %d/%d loss %.4f (%.1f examples/s)", epoch, step, total, recent,
                             min(b + per_worker, len(idx)) * world / (time.perf_counter() - t0))
                    tracker.log({"train_loss_step": recent}, step)
            train_s = time.perf_counter() - t0
            outputs = predict(core, task, prepared.eval.features, eval_idx, cfg.eval_batch_size, cfg.pad_id, device)
            gathered = gather_outputs(eval_idx, outputs, len(prepared.eval.features))
            metrics: dict[str, float] = {"epoch": epoch}
            checkpoint_dir = None
            if rank == 0:
                scores = score(task, prepared.eval, prepared.label_map, gathered, cfg.max_answer_length)
                metrics.update({f"eval_{k}": v for k, v in scores.items()})
                metrics.update(train_loss=float(torch.stack(losses).float().mean()) if losses else math.nan,
                               train_seconds=train_s, train_examples_per_s=len(idx) * world / max(train_s, 1e-9),
                               epoch_seconds=time.perf_counter() - t0, lr=float(scheduler.get_last_lr()[0]))
                tracker.log({k: v for k, v in metrics.items() if k != "epoch"}, epoch)
                log.info("epoch %d: %s", epoch, {k: float(f"{v:.4g}") for k, v in metrics.items()})
                value = metrics[main_key]
                if not math.isnan(value) and (value > best or best == -math.inf):
                    best = value
                    checkpoint_dir = tempfile.mkdtemp(prefix="finetune-best-")
                    core.save_pretrained(checkpoint_dir, vocab_file=cfg.vocab_file, do_lower_case=cfg.do_lower_case)
                    Path(checkpoint_dir, BEST_METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
            report(metrics, checkpoint_dir)
            if checkpoint_dir:
                shutil.rmtree(checkpoint_dir, ignore_errors=True)
    finally:
        tracker.close()
