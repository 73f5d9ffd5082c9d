"""Which of bert_core's fused GPU kernels (`bert_core.kernels`, Triton, optional) a run uses.

`RuntimeConfig.fused_kernels` (`--fused-kernels`): None = bert_core's own default (the kernels on CUDA when Triton
is installed, the plain PyTorch composition elsewhere), True = always (fails with the fix where Triton is missing),
False = never. `RuntimeConfig.low_precision_residual`: the fused LayerNorm sites keep the residual stream in bf16
under autocast (`KernelOptions.low_precision_residual`; whether the loss curve stays that of fp32 is what a
2,000-step run with and without it measures). Runtime choices: checkpoints are the same either way.

Where the kernels run (CUDA by default), `check` tests each against the composition at worker start and switches
off those that disagree (issue 24); a kernel error that still escapes during training ends the run as a
`KernelFault` verdict naming `--fused-kernels off` (`as_fault`), which the Ray wrapper returns instead of letting
Ray Train restart the workers into the same fault.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from bert_core.kernels import KernelOptions, set_kernel_options
from bert_core.kernels.self_check import CheckResult, self_check, switch_off_failed
from training.worker import Verdict

log = logging.getLogger(__name__)


def apply(model: nn.Module, fused: bool | None, low_precision_residual: bool = False) -> None:
    """Set the kernel choice on every fused-kernel site of `model` (the defaults leave bert_core's own)."""
    if fused is None and not low_precision_residual:
        return
    options = KernelOptions(fused=fused, low_precision_residual=low_precision_residual)
    log.info("fused kernels: %s at %d sites", options, set_kernel_options(model, options))


class KernelFault(Verdict):
    """A GPU kernel failed during training while bert_core's fused kernels were on: the run ends with one line
    naming `--fused-kernels off`, and Ray Train does not restart the workers into the same fault."""


def current_options(model: nn.Module) -> KernelOptions:
    """The options on `model`'s fused-kernel sites (all the same: `set_kernel_options` sets them together)."""
    for m in model.modules():
        if isinstance(getattr(m, "kernels", None), KernelOptions):
            return m.kernels
    return KernelOptions(fused=False)


def check(model: nn.Module, device: torch.device, rows: int) -> dict[str, CheckResult]:
    """At worker start: run each fused kernel `model` uses on `device` once at `rows` tokens against the
    composition (`bert_core.kernels.self_check`) and switch off, with one WARNING line each, those that disagree
    or fail. Nothing runs where the model uses no kernel (the CPU path)."""
    options = current_options(model)
    cfg = model.config
    results = self_check(rows, cfg.hidden_size, cfg.intermediate_size, device, options,
                         dropout=cfg.hidden_dropout_prob)
    if results:
        log.info("fused kernels checked against the composition at %d tokens: %s", rows,
                 "; ".join(f"{name} {'ok' if r.ok else 'FAILED'} ({r.figure})" for name, r in results.items()))
    checked = switch_off_failed(options, results)
    if checked != options:
        set_kernel_options(model, checked)
    return results


def as_fault(error: BaseException, model: nn.Module, device: torch.device) -> KernelFault | None:
    """`error` as a `KernelFault` when it is a GPU kernel's (CUDA, Triton or Inductor's launch of one) and the
    model ran fused kernels on `device`; None otherwise (the error stays what it was)."""
    if isinstance(error, Verdict) or not current_options(model).use_fused(torch.empty(0, device=device)):
        return None
    chain, seen = [], error
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    accelerator = getattr(torch, "AcceleratorError", ())
    if not any(isinstance(e, accelerator) or type(e).__module__.split(".")[0] == "triton"
               or "CUDA error" in str(e) or "triton" in str(e).lower() for e in chain):
        return None
    first = (str(error).strip().splitlines() or [""])[0][:300]
    return KernelFault(f"a GPU kernel failed during training with bert_core's fused kernels on "
                       f"({type(error).__name__}: {first}); rerun with --fused-kernels off")
