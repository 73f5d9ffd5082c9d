"""Which of bert_core's fused GPU kernels (`bert_core.kernels`, Triton, optional) a run uses.

`RuntimeConfig.fused_kernels` (`--fused-kernels`): None = bert_core's own default, which is the measured path:
the PyTorch composition (Inductor's fusion of it when compiled) on every device until a GPU run shows the fused op
faster (`bert_core.kernels.options.FUSED_BY_DEFAULT`); True = always (fails with the fix where Triton is missing),
False = never. `RuntimeConfig.low_precision_residual`: the fused LayerNorm sites keep the residual stream in bf16
under autocast (`KernelOptions.low_precision_residual`; whether the loss curve stays that of fp32 is what a
2,000-step run with and without it measures); a setting of the fused op, so it needs the kernels on (`validate`).
Runtime choices: checkpoints are the same either way.

Where the kernels run, `check` tests each against the composition at worker start and switches off those that
disagree (issue 24). A GPU fault of a kernel, at any point after that, ends the run as a `KernelFault` verdict
naming the kernels and `--fused-kernels off`, which the Ray wrapper returns instead of letting Ray Train restart
the workers into the same fault: in the self-check itself (a device fault there leaves the CUDA context unusable,
so the run cannot go on without the kernel), while precompiling, and in a step (`kernel_faults`, issue 33).
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
from torch import nn

from bert_core.kernels import KernelOptions, set_kernel_options
from bert_core.kernels.options import FUSED_BY_DEFAULT
from bert_core.kernels.self_check import FLAG, CheckResult, self_check, switch_off_failed
from training.worker import Verdict

log = logging.getLogger(__name__)

# The flags, one definition for the jobs and the benchmarks: --fused-kernels CHOICE -> RuntimeConfig.fused_kernels.
FUSED_KERNELS = {"auto": None, "on": True, "off": False}
FUSED_KERNELS_HELP = ("bert_core's fused Triton dropout + residual + LayerNorm op. auto: the measured path, Inductor's "
                      "composition on CUDA (by byte count the op moves 0.95-0.97x of what Inductor's fusion moves, "
                      "so it is on by default only once a GPU run shows it >= 3%% faster per step; "
                      "benchmarks/gpu_suite.py --call 1 always measures both: docs/benchmarks.md, GPU); on: the "
                      "fused op, checked against the composition at start; off: never")
LOW_PRECISION_RESIDUAL_HELP = ("with --fused-kernels on: the fused LayerNorm sites keep the residual stream in bf16 "
                               "under autocast (its loss curve is unmeasured)")


def validate(fused: bool | None, low_precision_residual: bool) -> None:
    """A ValueError naming the fix when the flags ask for the bf16 residual stream without the fused op that keeps
    it (the composition's residual is autocast's fp32 LayerNorm output either way)."""
    if low_precision_residual and not (fused is True or (fused is None and FUSED_BY_DEFAULT)):
        raise ValueError("--low-precision-residual is a setting of the fused LayerNorm op: add --fused-kernels on "
                         "(the default, Inductor's composition, keeps the residual stream in fp32)")


def apply(model: nn.Module, fused: bool | None, low_precision_residual: bool = False) -> None:
    """Set the kernel choice on every fused-kernel site of `model` (the defaults leave bert_core's own)."""
    validate(fused, low_precision_residual)
    if fused is None and not low_precision_residual:
        return
    options = KernelOptions(fused=fused, low_precision_residual=low_precision_residual)
    log.info("fused kernels: %s at %d sites", options, set_kernel_options(model, options))


class KernelFault(Verdict):
    """A GPU kernel failed (in the self-check, while precompiling, or in a step) while bert_core's fused kernels were
    on: the run ends with one line naming the kernels and `--fused-kernels off`, and Ray Train does not restart the
    workers into the same fault."""


def current_options(model: nn.Module) -> KernelOptions:
    """The options on `model`'s fused-kernel sites (all the same: `set_kernel_options` sets them together)."""
    for m in model.modules():
        if isinstance(getattr(m, "kernels", None), KernelOptions):
            return m.kernels
    return KernelOptions(fused=False)


def kernels_in_use(options: KernelOptions) -> list[str]:
    """The fused kernels `options` turns on where they run (the names the self-check and the verdicts use)."""
    return [name for name, on in (("dropout_layer_norm", options.fused_layer_norm),
                                  ("bias_gelu", options.fused_bias_gelu)) if on]


def check(model: nn.Module, device: torch.device, rows: int) -> dict[str, CheckResult]:
    """At worker start: run each fused kernel `model` uses on `device` once at `rows` tokens against the
    composition (`bert_core.kernels.self_check`) and switch off, with one WARNING line each, those that disagree
    or fail. A device fault of a kernel there (the CUDA context is then unusable) raises a `KernelFault` naming
    it. Nothing runs where the model uses no kernel (the default, and the CPU path)."""
    options = current_options(model)
    cfg = model.config
    with kernel_faults(model, device, "in the start-of-run self-check"):
        results = self_check(rows, cfg.hidden_size, cfg.intermediate_size, device, options,
                             dropout=cfg.hidden_dropout_prob)
    if results:
        log.info("fused kernels checked against the composition at %d tokens: %s", rows,
                 "; ".join(f"{name} {'ok' if r.ok else 'FAILED'} ({r.figure})" for name, r in results.items()))
    faulted = {name: r for name, r in results.items() if r.device_fault}
    if faulted:
        name, result = next(iter(faulted.items()))
        raise KernelFault(f"fused kernel {name} faulted on the GPU in the start-of-run self-check ({result.figure}); "
                          f"rerun with {FLAG}")
    checked = switch_off_failed(options, results)
    if checked != options:
        set_kernel_options(model, checked)
    return results


def as_fault(error: BaseException, model: nn.Module, device: torch.device,
             stage: str = "during training") -> KernelFault | None:
    """`error` as a `KernelFault` when it is a GPU kernel's (CUDA, Triton or Inductor's launch of one) and the
    model ran fused kernels on `device`; None otherwise (the error stays what it was). `stage` says when."""
    options = current_options(model)
    in_use = kernels_in_use(options)  # none left when the self-check switched every one off
    if isinstance(error, Verdict) or not in_use or not options.use_fused(torch.empty(0, device=device)):
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
    return KernelFault(f"a GPU kernel failed {stage} with bert_core's fused kernels on "
                       f"({', '.join(in_use)}) ({type(error).__name__}: {first}); rerun with {FLAG}")


@contextlib.contextmanager
def kernel_faults(model: nn.Module, device: torch.device, stage: str) -> Iterator[None]:
    """Inside: a GPU kernel's error while the fused kernels are on is raised as the run's `KernelFault` (`as_fault`);
    any other error stays what it was."""
    try:
        yield
    except Exception as e:
        fault = as_fault(e, model, device, stage)
        if fault is None:
            raise
        raise fault from e
