"""The fused kernels check themselves on the device a run is about to train on (issue 24).

`self_check` runs each kernel the options turn on once, forward and backward, at the run's shapes (tokens of the
largest micro-batch x hidden / intermediate), against the PyTorch composition it replaces on the same inputs and
the same dropout mask; `switch_off_failed` turns off each kernel whose result is off by more than bf16 tolerance or
that raised, with one WARNING line naming the kernel, the figure and the flag that turns them all off. The run then
trains on the composition at those sites. A compiled kernel can be wrong on one GPU and right in the interpreter
(a miscompile, a new architecture, a driver); this is the net for that, not a test suite: one call per run, about
the cost of one site's forward and backward. A check that ends in a device fault (a CUDA error, after which the
context is unusable) is marked `device_fault`: the caller ends the run naming the kernel (pretraining.kernel_options).

Errors are measured as relative L2 distance, ||fused - composition|| / ||composition||, per output and gradient;
the limit, 2e-2, is about five bf16 roundings (2**-8 each) and far below what a wrong mask, a wrong reduction or a
missing term gives (order 1).
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .bias_gelu import bias_gelu
from .dropout_layer_norm import dropout_add_layer_norm_and_copy, keep_mask
from .options import KernelOptions

log = logging.getLogger(__name__)

LIMIT = 2e-2
FLAG = "--fused-kernels off"


@dataclass(frozen=True)
class CheckResult:
    """ok: the kernel agreed with the composition; figure: what was measured (or the error), for the log;
    device_fault: the check ended in a fault of the device (a CUDA error: the context is unusable afterwards, so a
    run cannot go on on the composition either; the caller ends it)."""

    ok: bool
    """The kernel agreed with the composition: relative L2 error within ``LIMIT`` (about five bf16 roundings)."""
    figure: str
    """What was measured (the worst output or gradient and its error), or the error raised, for the log."""
    device_fault: bool = False
    """The check ended in a CUDA error: the context is unusable, so the caller ends the run."""


def is_device_fault(error: BaseException) -> bool:
    """A CUDA error (torch's AcceleratorError, or older torch's RuntimeError saying so), not a host-side failure
    such as a Triton compile or launch error, after which the device still works."""
    return isinstance(error, getattr(torch, "AcceleratorError", ())) or "CUDA error" in str(error)


def _relative_error(got: Tensor, want: Tensor) -> float:
    got, want = got.detach().float(), want.detach().float()
    return ((got - want).norm() / want.norm().clamp_min(1e-12)).item()


def _worst(pairs: dict[str, tuple[Tensor, Tensor]]) -> tuple[str, float]:
    errors = {name: _relative_error(*pair) for name, pair in pairs.items()}
    name = max(errors, key=lambda k: (errors[k] != errors[k], errors[k]))  # NaN counts as the worst
    return name, errors[name]


def _inputs(shape: tuple[int, int], dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Tensor:
    return torch.randn(shape, generator=g).to(device, dtype).requires_grad_()


def check_layer_norm(rows: int, hidden: int, device: torch.device, p: float, residual_dtype: torch.dtype) -> dict:
    """{name: (fused, composition)} for out, the GEMM's copy, and the gradients of x, residual, weight, bias."""
    g = torch.Generator().manual_seed(0)
    x = _inputs((rows, hidden), torch.bfloat16, device, g)
    r = _inputs((rows, hidden), residual_dtype, device, g)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device).requires_grad_()
    b = (0.1 * torch.randn(hidden, generator=g)).to(device).requires_grad_()
    copy_dtype = torch.bfloat16 if residual_dtype != torch.bfloat16 else None
    dy = torch.randn(rows, hidden, generator=g).to(device, residual_dtype)
    dcopy = torch.randn(rows, hidden, generator=g).to(device, torch.bfloat16)
    seed = torch.tensor([20241124], dtype=torch.int64, device=device)
    out, copy = dropout_add_layer_norm_and_copy(x, r, w, b, p=p, eps=1e-12, copy_dtype=copy_dtype, seed=seed)
    outs, grads = ([out, copy], [dy, dcopy]) if copy is not None else ([out], [dy])
    torch.autograd.backward(outs, grads)
    fused = {"out": out, "x.grad": x.grad, "residual.grad": r.grad, "weight.grad": w.grad, "bias.grad": b.grad}
    if copy is not None:
        fused["copy"] = copy

    ref = [t.detach().clone().requires_grad_() for t in (x, r, w, b)]
    keep = keep_mask(seed, rows, hidden, p) if p > 0 else None
    dropped = ref[0].float() * keep / (1 - p) if keep is not None else ref[0].float()
    ref_out = F.layer_norm(dropped + ref[1].float(), (hidden,), ref[2], ref[3], 1e-12)
    ref_copy = ref_out.to(torch.bfloat16) if copy is not None else None
    torch.autograd.backward([ref_out, ref_copy] if copy is not None else [ref_out], grads)
    want = {"out": ref_out, "x.grad": ref[0].grad, "residual.grad": ref[1].grad, "weight.grad": ref[2].grad,
            "bias.grad": ref[3].grad}
    if copy is not None:
        want["copy"] = ref_copy
    pairs = {k: (fused[k], want[k]) for k in want}
    if keep is not None:  # the mask itself: a constant or broken generator would pass the comparison above
        kept = keep.float().mean().item()
        pairs["keep fraction"] = (torch.tensor([kept]), torch.tensor([1 - p]))
    return pairs


def check_bias_gelu(rows: int, intermediate: int, device: torch.device) -> dict:
    g = torch.Generator().manual_seed(1)
    h = _inputs((rows, intermediate), torch.bfloat16, device, g)
    bias = (0.1 * torch.randn(intermediate, generator=g)).to(device).requires_grad_()
    dy = torch.randn(rows, intermediate, generator=g).to(device, torch.bfloat16)
    y = bias_gelu(h, bias)
    y.backward(dy)
    ref_h, ref_b = h.detach().clone().requires_grad_(), bias.detach().clone().requires_grad_()
    ref = F.gelu(ref_h.float() + ref_b)
    ref.backward(dy.float())
    return {"out": (y, ref), "h.grad": (h.grad, ref_h.grad), "bias.grad": (bias.grad, ref_b.grad)}


def self_check(rows: int, hidden: int, intermediate: int, device: torch.device, options: KernelOptions,
               dropout: float = 0.1) -> dict[str, CheckResult]:
    """Each kernel `options` uses on `device`, forward and backward at (rows, hidden / intermediate) against the
    composition. Returns {kernel name: CheckResult}; empty when the options use no kernel there."""
    probe = torch.empty(0, device=device)
    if not options.use_fused(probe):
        return {}
    checks = {}
    if options.fused_layer_norm:
        residual = torch.bfloat16 if options.low_precision_residual else torch.float32
        checks["dropout_layer_norm"] = lambda: check_layer_norm(rows, hidden, device, dropout, residual)
    if options.fused_bias_gelu:
        checks["bias_gelu"] = lambda: check_bias_gelu(rows, intermediate, device)
    results = {}
    for name, check in checks.items():
        shape = f"{rows} x {intermediate if name == 'bias_gelu' else hidden}"
        try:
            worst, error = _worst(check())
            if device.type == "cuda":  # inside the try: an asynchronous fault of this kernel surfaces here
                torch.cuda.synchronize(device)
        except Exception as e:  # noqa: BLE001 - any failure of a kernel's launch or run is the verdict
            first = (str(e).strip().splitlines() or [""])[0][:200]
            results[name] = CheckResult(False, f"raised {type(e).__name__}: {first} at {shape}", is_device_fault(e))
            if results[name].device_fault:
                break  # nothing more can run on this device
            continue
        ok = error <= LIMIT  # False for NaN too
        results[name] = CheckResult(ok, f"relative error {error:.3g} in {worst} at {shape} (limit {LIMIT:g})")
    return results


def switch_off_failed(options: KernelOptions, results: dict[str, CheckResult]) -> KernelOptions:
    """`options` with each failed kernel turned off, one WARNING line each (the composition runs there instead)."""
    off = {}
    for name, result in results.items():
        if result.ok:
            continue
        log.warning("fused kernel %s disagrees with the PyTorch composition on this device (%s): switched off, "
                    "the run continues on the composition; %s turns every fused kernel off", name, result.figure,
                    FLAG)
        off["fused_layer_norm" if name == "dropout_layer_norm" else "fused_bias_gelu"] = False
    return dataclasses.replace(options, **off) if off else options


__all__ = ["CheckResult", "FLAG", "LIMIT", "is_device_fault", "self_check", "switch_off_failed"]
