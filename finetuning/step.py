"""One fine-tuning step: a head model's loss, backward, and the shared update (`training.step.apply_gradients`:
clipping, the non-finite guard)."""
from __future__ import annotations

import torch
from torch import nn

from training.step import apply_gradients, autocast


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
