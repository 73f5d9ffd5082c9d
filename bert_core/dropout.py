"""Dropout whose random mask is cheap on CPU, and the attention math that uses it.

On CPU, `torch.nn.functional.dropout` draws one Mersenne-Twister double per element under the generator's lock: it
runs on one thread whatever `torch.get_num_threads()` says, and at BERT's 13 dropouts per step it costs about a
fifth of a small model's CPU training step. Here the keep mask comes from 16-bit slices of 64-bit words drawn by
NumPy's PCG64 (about 40x cheaper per element), seeded from torch's default generator, so `torch.manual_seed` still
makes every mask reproducible (our training loop reseeds it per rank and step). The keep probability is quantised to
1/65536 (p = 0.1 drops with probability 6554/65536 = 0.100006); kept values are scaled by 1/(1 - p) as usual.

`scaled_dot_product_attention` with `dropout_p > 0` runs its math (non-fused) path on CPU anyway, through a "safe"
softmax that adds three passes over the scores; `attention` below is that same math with a plain softmax (masked
keys get the dtype's lowest value, so a row with every key masked averages instead of producing NaN) and the cheap
mask. On GPUs and under `torch.compile` everything goes to torch's own kernels (Philox masks, fused attention).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

_LEVELS = 1 << 16


def keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> torch.Tensor:
    """Bool CPU tensor of `shape`, True with probability 1 - p (quantised to 1/65536); seeded from torch's RNG."""
    n = math.prod(shape)
    seed = int(torch.randint(0, 2**62, (1,)).item())  # advances torch's default generator: manual_seed governs it
    words = np.random.Generator(np.random.PCG64(seed)).bit_generator.random_raw((n + 3) // 4)
    bits = torch.from_numpy(words.view(np.int16)[:n]).view(shape)
    return bits >= round(p * _LEVELS) - _LEVELS // 2


class _MaskedScale(torch.autograd.Function):
    """x * keep / (1 - p), with the bool mask (1 byte per element) saved for backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return (x * keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return (grad * keep).mul_(ctx.scale), None, None


def _fast_path(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Same contract as `F.dropout` (not in place); the cheap mask on CPU, torch's elsewhere."""
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not _fast_path(x):
        return F.dropout(x, p, training=True)
    return _MaskedScale.apply(x, keep_mask(x.shape, p), 1.0 / (1.0 - p))


class Dropout(nn.Module):
    """Drop-in for `nn.Dropout` (no parameters, so checkpoints are unchanged) using `dropout` above."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
              dropout_p: float) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p)` for boolean key masks (True = attend).

    Fused kernels when there is no dropout or off CPU; with dropout on CPU, the math path with the cheap mask.
    """
    if dropout_p == 0.0 or not _fast_path(q):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    scores = torch.matmul(q * (1.0 / math.sqrt(q.shape[-1])), k.transpose(-2, -1))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, torch.finfo(scores.dtype).min)
    probs = dropout(torch.softmax(scores, dim=-1), dropout_p)
    return torch.matmul(probs, v)


__all__ = ["Dropout", "attention", "dropout", "keep_mask"]
