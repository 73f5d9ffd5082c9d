"""Which of bert_core's fused GPU kernels (`bert_core.kernels`, Triton, optional) a run uses.

`RuntimeConfig.fused_kernels` (`--fused-kernels`): None = bert_core's own default (the kernels on CUDA when Triton
is installed, the plain PyTorch composition elsewhere), True = always (fails with the fix where Triton is missing),
False = never. `RuntimeConfig.low_precision_residual`: the fused LayerNorm sites keep the residual stream in bf16
under autocast (`KernelOptions.low_precision_residual`; whether the loss curve stays that of fp32 is what a
2,000-step run with and without it measures). Runtime choices: checkpoints are the same either way.
"""
from __future__ import annotations

import logging

from torch import nn

from bert_core.kernels import KernelOptions, set_kernel_options

log = logging.getLogger(__name__)


def apply(model: nn.Module, fused: bool | None, low_precision_residual: bool = False) -> None:
    """Set the kernel choice on every fused-kernel site of `model` (the defaults leave bert_core's own)."""
    if fused is None and not low_precision_residual:
        return
    options = KernelOptions(fused=fused, low_precision_residual=low_precision_residual)
    log.info("fused kernels: %s at %d sites", options, set_kernel_options(model, options))
