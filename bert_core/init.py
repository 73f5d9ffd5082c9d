"""Weight initialisation as in the original BERT: truncated normal (cut at +/-2 std) with std
`initializer_range` (0.02) for every dense and embedding matrix, zero biases, LayerNorm weight 1 and bias 0.

TF's `truncated_normal_initializer` redraws values beyond two standard deviations, which is what
`nn.init.trunc_normal_` with a=-2std, b=2std does. (HF uses a plain normal; the difference is in the tails only.)
"""
from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def init_bert_weights(module: nn.Module, initializer_range: float) -> None:
    """Initialise one module (use with `model.apply`). Parameters owned elsewhere (tied decoder) are skipped."""
    std = initializer_range
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.trunc_normal_(module.weight, mean=0.0, std=std, a=-2 * std, b=2 * std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
    # Free-standing bias parameters (the MLM output bias) start at zero.
    for name, p in module.named_parameters(recurse=False):
        if name == "bias" and not isinstance(module, (nn.Linear, nn.LayerNorm)):
            nn.init.zeros_(p)
