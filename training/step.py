"""The optimisation steps, free of any launcher: pre-training (MLM + NSP, gradient accumulation) and fine-tuning.

The Ray Train worker and `training.loop.fit` call these once per optimizer step; tests call them on CPU with a tiny
config and no process group. Nothing here knows about Ray, MLflow or storage.

Loss weighting under accumulation: the MLM loss of the step is the mean over *all* masked tokens of the rank's
micro-batches (each micro-batch's mean is weighted by its share of masked tokens), the NSP loss the mean over all
its sequences. So accumulating k micro-batches gives the same gradient as one batch k times larger (up to float
rounding), whatever the number of masks per row. Across ranks DDP averages, as usual.

No host reads of device tensors inside a step: the MLM weights are computed as tensors on the device (the masked
counts are data, reading them with int() would wait for the GPU every micro-batch), metrics accumulate into
`MetricSums` on the device, and the gradient norm is returned as a tensor for the caller to read when it logs.

The non-finite guard: a step whose gradient norm is NaN or inf (a non-finite loss gives one too) does not update
the weights. The optimizer skips on the device (`found_inf`, the AMP grad scaler's protocol, which torch's fused
Adam/AdamW and our Lamb honour), so the flag is never read on the host; the step returns it (`finite`) for the
loop to count and act on at log time (`training.guard`).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from bert_core.losses import IGNORE_INDEX
from training.metrics import MetricSums



def autocast(device_type: str, dtype: torch.dtype | None):
    """bf16 autocast when `dtype` is given, else nothing (fp32)."""
    return torch.autocast(device_type=device_type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


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
            # packed rows (training.packing); absent otherwise
            sequence_lengths=batch.get("sequence_lengths"),
        )


def micro_weights(micro_batches: Sequence[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(MLM weights, NSP weights) as device tensors: each micro-batch's share of the step's masked tokens and of
    its labelled sequences (packed micro-batches have unused places labelled -100). Both counts are data, read
    on the device."""
    mlm = torch.stack([(b["masked_lm_labels"] != IGNORE_INDEX).sum() for b in micro_batches]).float()
    nsp = torch.stack([(b["next_sentence_label"] != IGNORE_INDEX).sum() for b in micro_batches]).float()
    return mlm / mlm.sum().clamp(min=1), nsp / nsp.sum().clamp(min=1)


def step_if_finite(optimizer: torch.optim.Optimizer, finite: torch.Tensor) -> None:
    """`optimizer.step()` unless `finite` (a bool tensor) is False: weights and optimizer state stay untouched."""
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        # Fused Adam/AdamW and Lamb skip on the device when found_inf is 1 (their step counts are not advanced).
        optimizer.grad_scale, optimizer.found_inf = None, (~finite).float()
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale, optimizer.found_inf
    elif bool(finite):  # other optimizers: a host read (a sync on a GPU; none is built for one by this trainer)
        optimizer.step()


def apply_gradients(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler=None,
                    max_grad_norm: float = 1.0) -> dict[str, float | torch.Tensor]:
    """Clip (max_grad_norm <= 0: measure only), step unless the gradient is non-finite, schedule. Returns the lr
    used, the pre-clip norm and whether the update was applied (`finite`), as tensors. Shared by pre-training and
    fine-tuning. The schedule advances on a skipped step too: the lr stays a function of the step number."""
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else math.inf)
    # Under DDP the gradients are already averaged over ranks, so every rank sees the same norm and skips alike.
    finite = torch.isfinite(grad_norm)
    lr = optimizer.param_groups[0]["lr"]
    step_if_finite(optimizer, finite)
    if scheduler is not None:
        scheduler.step()
    return {"learning_rate": lr, "grad_norm": grad_norm, "finite": finite}


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[dict[str, torch.Tensor]],
    *,
    scheduler=None,
    max_grad_norm: float = 1.0,
    autocast_dtype: torch.dtype | None = None,
    sums: MetricSums | None = None,
) -> dict[str, float | torch.Tensor]:
    """One pre-training step: forward/backward over the micro-batches (DDP gradient sync only on the last), clip,
    step (skipped when the gradient is non-finite), schedule. `sums`, when given, accumulates the micro-batches'
    metrics (on the device). Returns `apply_gradients`'s values plus `loss`, this rank's loss of the step (a
    tensor, for the guard's spike detection)."""
    if not micro_batches:
        raise ValueError("train_step needs at least one micro-batch")
    model.train()
    optimizer.zero_grad(set_to_none=True)
    no_sync = getattr(model, "no_sync", None)  # DDP: all-reduce gradients once, on the last micro-batch
    w_mlm, w_nsp = micro_weights(micro_batches)
    step_loss = torch.zeros((), device=w_mlm.device)
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
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


def finetune_step(model: nn.Module, batch: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer,
                  scheduler=None, max_grad_norm: float = 1.0,
                  autocast_dtype: torch.dtype | None = None) -> torch.Tensor:
    """One fine-tuning step on a head model whose output has `.loss` (the reference clips the norm at 1.0).
    Returns the loss, detached, as a tensor (read it when logging)."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    with autocast(batch["input_ids"].device.type, autocast_dtype):
        loss = model(**batch).loss
    loss.backward()
    apply_gradients(model, optimizer, scheduler, max_grad_norm)
    return loss.detach()


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]],
             autocast_dtype: torch.dtype | None = None) -> MetricSums:
    """Metric sums over `batches` in eval mode (no dropout); the model's previous mode is restored.

    Pass the unwrapped module, not DDP: ranks may hold different numbers of eval batches, and DDP's forward
    can communicate. Reduce the returned sums across ranks once, after the loop.
    """
    was_training = model.training
    model.eval()
    sums = MetricSums()
    try:
        for batch in batches:
            sums.add(forward(model, batch, autocast_dtype), batch)
    finally:
        model.train(was_training)
    return sums


def to_device(batch: dict, device: torch.device | str) -> dict[str, torch.Tensor]:
    """numpy or torch arrays -> torch tensors on `device` (pinned and non-blocking on GPU, so the copy overlaps)."""
    device = torch.device(device)
    out = {}
    for k, v in batch.items():
        t = v if isinstance(v, torch.Tensor) else torch.from_numpy(v)
        if device.type == "cuda" and not t.is_pinned():
            t = t.pin_memory()
        out[k] = t.to(device, non_blocking=True)
    return out
