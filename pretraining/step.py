"""The pre-training step (MLM + NSP, gradient accumulation) and evaluation, free of any launcher.

The Ray Train worker and `pretraining.loop.fit` call these once per optimizer step; tests call them on CPU with a tiny
config and no process group. Nothing here knows about Ray, MLflow or storage.

Loss weighting: the MLM loss of the step is the mean over *all* masked tokens of the step's global batch (each
micro-batch's mean weighted by its share of them), the NSP loss the mean over all its sequences. The loader knows
the global batch's totals (`pretraining.order.GlobalBatch.totals`), so each rank weights its micro-batches by their
share of the global batch, times the world size (DDP averages over ranks). The gradient is then the same whether the
batch is split over 1 worker with k micro-batches or k workers with one (up to float rounding), whatever the number
of masks per row or the rows per rank. Without totals the weights are the rank's own shares (the mean over its
micro-batches, then DDP's average).

No host reads of device tensors inside a step: the MLM weights are computed as tensors on the device (the masked
counts are data, reading them with int() would wait for the GPU every micro-batch), metrics accumulate into
`MetricSums` on the device, and the gradient norm is returned as a tensor for the caller to read when it logs.

The non-finite guard and the update are `training.step`'s.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from bert_core.losses import IGNORE_INDEX
from pretraining.metrics import MetricSums
from training.step import apply_gradients, autocast


def forward(model: nn.Module, batch: dict[str, torch.Tensor], autocast_dtype: torch.dtype | None = None):
    """The pre-training forward on one collated batch, under autocast when `autocast_dtype` is given."""
    with autocast(batch["input_ids"].device.type, autocast_dtype):
        return model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            masked_lm_positions=batch["masked_lm_positions"],
            masked_lm_labels=batch["masked_lm_labels"],
            next_sentence_label=batch["next_sentence_label"],
            # packed rows (pretraining.packing); absent otherwise
            sequence_lengths=batch.get("sequence_lengths"),
        )


def micro_weights(micro_batches: Sequence[dict[str, torch.Tensor]], totals: tuple[int, int] | None = None,
                  world: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(MLM weights, NSP weights) as device tensors: each micro-batch's share of the step's masked tokens and of
    its labelled sequences (packed micro-batches have unused places labelled -100); of the global batch's
    `totals` (masked tokens, labelled sequences) times `world` when given, else of this rank's micro-batches. The
    counts are data, read on the device; the totals are the loader's host numbers."""
    mlm = torch.stack([(b["masked_lm_labels"] != IGNORE_INDEX).sum() for b in micro_batches]).float()
    nsp = torch.stack([(b["next_sentence_label"] != IGNORE_INDEX).sum() for b in micro_batches]).float()
    if totals is not None:
        return mlm * (world / max(totals[0], 1)), nsp * (world / max(totals[1], 1))
    return mlm / mlm.sum().clamp(min=1), nsp / nsp.sum().clamp(min=1)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[dict[str, torch.Tensor]],
    *,
    scheduler=None,
    max_grad_norm: float = 1.0,
    autocast_dtype: torch.dtype | None = None,
    sums: MetricSums | None = None,
    totals: tuple[int, int] | None = None,
    world: int = 1,
    seeds: Sequence[int] | None = None,
) -> dict[str, float | torch.Tensor]:
    """One pre-training step: forward/backward over the micro-batches (DDP gradient sync only on the last), clip,
    step (skipped when the gradient is non-finite), schedule. `sums`, when given, accumulates the micro-batches'
    metrics (on the device); `totals` and `world` weight the losses by the global batch (`micro_weights`); `seeds`,
    one per micro-batch, seed torch's generators before its forward (dropout keyed by the micro-batch's place in
    the global batch). Returns `apply_gradients`'s values plus `loss`, this rank's loss of the step (a tensor,
    for the guard's spike detection; its mean over the ranks is the global batch's loss)."""
    if not micro_batches:
        raise ValueError("train_step needs at least one micro-batch")
    model.train()
    optimizer.zero_grad(set_to_none=True)
    no_sync = getattr(model, "no_sync", None)  # DDP: all-reduce gradients once, on the last micro-batch
    w_mlm, w_nsp = micro_weights(micro_batches, totals, world)
    step_loss = torch.zeros((), device=w_mlm.device)
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        if seeds is not None:
            torch.manual_seed(seeds[i] % 2**63)
        with (no_sync() if no_sync is not None and not last else contextlib.nullcontext()):
            out = forward(model, batch, autocast_dtype)
            # No nan_to_num: the MLM loss of a micro-batch without masks is 0, never NaN (bert_core.losses), so a
            # NaN here is a diverged loss, and zeroing it would hide it (and its gradient) from the guard.
            loss = out.mlm_loss * w_mlm[i] + out.nsp_loss * w_nsp[i]
            loss.backward()
        step_loss = step_loss + loss.detach().float()
        if sums is not None:
            sums.add(out, batch)
    return {**apply_gradients(model, optimizer, scheduler, max_grad_norm), "loss": step_loss}


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]],
             autocast_dtype: torch.dtype | None = None,
             on_output: Callable[[Any, dict[str, torch.Tensor]], None] | None = None) -> MetricSums:
    """Metric sums over `batches` in eval mode (no dropout); the model's previous mode is restored. `on_output`
    sees each batch's model output (what the sums do not keep: the predictions).

    Pass the unwrapped module, not DDP: ranks may hold different numbers of eval batches, and DDP's forward
    can communicate. Reduce the returned sums across ranks once, after the loop.
    """
    was_training = model.training
    model.eval()
    sums = MetricSums()
    try:
        for batch in batches:
            out = forward(model, batch, autocast_dtype)
            sums.add(out, batch)
            if on_output is not None:
                on_output(out, batch)
    finally:
        model.train(was_training)
    return sums
