"""Losses and accuracy counters shared by the heads.

The sparse MLM loss is the reason the pre-training step is cheap: only the (typically 15%) masked positions are
gathered, transformed and projected onto the vocabulary. Projecting every position (what HF's BertForPreTraining
does) multiplies the largest matmul of a small BERT by ~1/0.15 and materialises a (B, T, V) logits tensor.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def valid_slots(positions: torch.Tensor, labels: torch.Tensor | None, batch_size: int) -> torch.Tensor:
    """(B, P) bool: which masked-LM slots are real. A slot is padding when its label is -100 (or, without labels,
    when its position is negative)."""
    if positions.dim() != 2 or positions.shape[0] != batch_size:
        raise ValueError(f"masked_lm_positions must be (batch={batch_size}, max_predictions), "
                         f"got {tuple(positions.shape)}")
    valid = positions >= 0
    if labels is not None:
        if labels.shape != positions.shape:
            raise ValueError(f"masked_lm_labels {tuple(labels.shape)} must have the shape of masked_lm_positions "
                             f"{tuple(positions.shape)} (-100 in padding slots)")
        valid = valid & (labels != IGNORE_INDEX)
    return valid


def mean_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean CE over rows whose label is not -100; 0 (with a gradient path) when there are none, never NaN.
    Computed in fp32 so bf16/fp16 logits do not lose the loss' precision."""
    logits = logits.reshape(-1, logits.shape[-1]).float()
    labels = labels.reshape(-1)
    total = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
    count = (labels != IGNORE_INDEX).sum()
    return total / count.clamp(min=1)


@torch.no_grad()
def accuracy_counts(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, count) over rows whose label is not -100, as int64 tensors (sum them across batches/ranks)."""
    labels = labels.reshape(-1)
    keep = labels != IGNORE_INDEX
    pred = logits.reshape(-1, logits.shape[-1]).argmax(-1)
    return ((pred == labels) & keep).sum(), keep.sum()
