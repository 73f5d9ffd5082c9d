"""Which of bert_core's fused GPU kernels (`bert_core.kernels`, Triton, optional) a run uses: `--fused-kernels`.

`RuntimeConfig.fused_kernels`: None = bert_core's own default (the kernels on CUDA when Triton is installed, the
plain PyTorch composition elsewhere), True = always (fails clearly without Triton, or in a tree without
`bert_core.kernels`), False = never. `RuntimeConfig.low_precision_residual`: the fused LayerNorm sites keep the
residual stream in bf16 under autocast (`KernelOptions.low_precision_residual`; whether the loss curve stays that
of fp32 is what a 2,000-step run with and without it measures). Runtime choices: checkpoints are the same.
"""
from __future__ import annotations

import importlib.util
import logging

from torch import nn

log = logging.getLogger(__name__)


def available() -> bool:
    """Whether this tree has `bert_core.kernels` (the fused kernels of issue 16)."""
    return importlib.util.find_spec("bert_core.kernels") is not None


def apply(model: nn.Module, fused: bool | None, low_precision_residual: bool = False) -> None:
    """Set the kernel choice on every fused-kernel site of `model` (None and False: bert_core's default)."""
    if fused is None and not low_precision_residual:
        return
    if not available():
        if fused or low_precision_residual:
            raise ValueError("--fused-kernels on / --low-precision-residual were asked for, but this bert_core has "
                             "no fused kernels (bert_core.kernels); use --fused-kernels auto or off")
        return
    from bert_core.kernels import KernelOptions, set_kernel_options

    options = KernelOptions(fused=fused, low_precision_residual=low_precision_residual)
    log.info("fused kernels: %s at %d sites", options, set_kernel_options(model, options))
