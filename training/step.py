"""What an optimisation step of either trainer shares: autocast, the gradient update with the non-finite guard, and
moving a batch to the device. Pre-training's step is `pretraining.step`, fine-tuning's `finetuning.step`.

The non-finite guard: a step whose gradient norm is NaN or inf (a non-finite loss gives one too) does not update
the weights. The optimizer skips on the device (`found_inf`, the AMP grad scaler's protocol, which torch's fused
Adam/AdamW and our Lamb honour), so the flag is never read on the host; the step returns it (`finite`) for the
loop to count and act on at log time (`training.guard`).
"""
from __future__ import annotations

import contextlib
import math

import torch
from torch import nn


def autocast(device_type: str, dtype: torch.dtype | None):
    """bf16 autocast when `dtype` is given, else nothing (fp32)."""
    return torch.autocast(device_type=device_type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


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
