"""`KernelOptions`: which of bert_core's fused kernels a model uses, and the choice made per call from the device.

A runtime choice, not part of `BertConfig` (which is the checkpoint's `config.json`): the same weights train and load
with or without the kernels. Each site module (`BertSelfOutput`, `BertOutput`, `BertIntermediate`) holds one
`KernelOptions` in its `kernels` attribute; `set_kernel_options(model, options)` sets it on all of them.

Triton is optional: only `importlib.util.find_spec` looks for it here; it is imported on the first fused call.

The default (`fused=None`) is the path that was measured: Inductor's composition on CUDA (`FUSED_BY_DEFAULT` is
False). By its byte count the fused dropout + residual + LayerNorm op moves 0.95-0.97x the bytes of the Inductor
fusion it replaces at the default fp32 residual (768 vs 805 MB per site at 256 x 128, `traffic.py`), so at most a
1-4% step gain, against the risk of a custom op inside Inductor and CUDA graphs that has not run on a GPU yet.
`FUSED_BY_DEFAULT` turns True only once a GPU run of `benchmarks/gpu_suite.py --call 1` (which always measures
both) shows the op at least 3% faster per step at the default settings; `fused=True` (`--fused-kernels on`) uses it
meanwhile.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch
from torch import nn

TRITON_INSTALLED = importlib.util.find_spec("triton") is not None
# What fused=None picks on CUDA when Triton is installed (see the module docstring): the composition until measured.
FUSED_BY_DEFAULT = False


@dataclass(frozen=True)
class KernelOptions:
    """fused: None = the default, the PyTorch composition (Inductor's fusion of it when compiled) on every device
    while `FUSED_BY_DEFAULT` is False (else the kernels for CUDA tensors when Triton is installed); False = always
    the composition; True = always the kernels, which on a CPU tensor means Triton's interpreter
    (TRITON_INTERPRET=1 set before triton is imported: tests only, slow).

    low_precision_residual: the dropout + residual + LayerNorm sites write their output, which is the next
    sublayer's residual, in the dtype of the sublayer's output (bf16 under bf16 autocast) instead of promoting it
    to fp32 as autocast's fp32 LayerNorm does. Statistics stay fp32 inside the kernel either way. Off by default:
    whether a bf16 residual stream keeps the fp32 loss curve is not measured yet (it needs a GPU run; the command
    is in bert_core/kernels/__init__.py).

    fused_layer_norm: the dropout + residual + LayerNorm sites use their kernel when `fused` picks the kernels
    (the default); False keeps the composition there only: what the start-of-run self-check
    (`bert_core.kernels.self_check`) sets when that kernel disagrees with the composition on the device.

    fused_bias_gelu: the FFN's bias + GELU (and in backward dGELU + the bias gradient) as one Triton kernel
    instead of the Linear's bias and torch's GELU. Off by default: it replaces a pass Inductor already fuses, and
    whether it wins is not measured on a GPU (bert_core/kernels/bias_gelu.py says what it saves).
    """

    fused: bool | None = None
    """None: by device, the PyTorch composition while ``FUSED_BY_DEFAULT`` is False (the measured path); False:
    always the composition; True: always the Triton kernels (Triton's interpreter on CPU: tests only)."""
    low_precision_residual: bool = False
    """Write the residual stream in the sublayer's dtype (bf16 under autocast) instead of fp32; off until a GPU
    run shows a bf16 residual keeps the fp32 loss curve."""
    fused_bias_gelu: bool = False
    """The FFN's bias + GELU as one Triton kernel; off: Inductor already fuses that pass, and no GPU measurement
    shows a gain yet."""
    fused_layer_norm: bool = True
    """Use the dropout + residual + LayerNorm kernel where ``fused`` picks the kernels; the start-of-run
    self-check sets it False when that kernel disagrees with the composition on the device."""

    def __post_init__(self) -> None:
        if self.fused not in (None, True, False):
            raise ValueError(f"KernelOptions.fused must be None (by device), True or False, got {self.fused!r}")
        for name in ("low_precision_residual", "fused_bias_gelu", "fused_layer_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"KernelOptions.{name} must be True or False, got {getattr(self, name)!r}")

    def use_fused(self, x: torch.Tensor) -> bool:
        """Whether a site runs its fused kernel for input `x` (decided from the device, no host sync)."""
        if self.fused is False:
            return False
        if self.fused is None:
            return FUSED_BY_DEFAULT and x.is_cuda and TRITON_INSTALLED
        if not TRITON_INSTALLED:
            raise ValueError("KernelOptions(fused=True) needs Triton: pip install 'bert-pretrain[gpu]', "
                             "or use fused=None to fall back to PyTorch where Triton is missing")
        return True


DEFAULT = KernelOptions()


def check_device(t: torch.Tensor) -> None:
    """Called by the ops before a launch: CUDA tensors, or CPU ones under Triton's interpreter."""
    if t.device.type == "cuda":
        return
    if t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction

        # triton.jit reads TRITON_INTERPRET when it wraps a function, Triton's own (tl.philox) at its import.
        if not isinstance(tl.philox, InterpretedFunction):
            raise ValueError("TRITON_INTERPRET=1 was set after triton had been imported; set it before the "
                             "process imports triton to run the fused kernels on CPU")
        return
    raise ValueError(f"the fused kernels run on CUDA tensors (on CPU only under Triton's interpreter, "
                     f"TRITON_INTERPRET=1), got a {t.device.type} tensor; use KernelOptions(fused=None)")


def set_kernel_options(model: nn.Module, options: KernelOptions) -> int:
    """Set `options` on every fused-kernel site of `model`; returns how many sites there are."""
    if not isinstance(options, KernelOptions):
        raise TypeError(f"options must be a bert_core.kernels.KernelOptions, got {type(options).__name__}")
    sites = [m for m in model.modules() if isinstance(getattr(m, "kernels", None), KernelOptions)]
    if not sites:
        raise ValueError(f"{type(model).__name__} has no fused-kernel sites (BertSelfOutput, BertOutput, "
                         "BertIntermediate); pass a bert_core model")
    for m in sites:
        m.kernels = options
    return len(sites)


__all__ = ["DEFAULT", "FUSED_BY_DEFAULT", "KernelOptions", "TRITON_INSTALLED", "check_device", "set_kernel_options"]
