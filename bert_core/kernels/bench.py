"""Each fused kernel against the PyTorch composition it replaces, eager and `torch.compile`d, at BERT-base sizes.

    python -m bert_core.kernels.bench                      # CUDA: seq 128 x batch 256 rows, H 768, I 3072
    python -m bert_core.kernels.bench --rows 16384         # seq 512 x 32
    TRITON_INTERPRET=1 python -m bert_core.kernels.bench --device cpu --rows 64 --iters 2 --no-compile  # smoke

For every kernel and variant: forward and forward + backward time per call (median over --iters, CUDA events),
and the bytes a perfectly fused pass must move per call divided by that time (GB/s), so a figure reads against
the device's memory bandwidth (H100 SXM 3.35 TB/s, H200 4.8 TB/s). Last, the speedup of the fused kernel over
the compiled composition (the peer, measured in the same run). Nothing is asserted: timings go to the log.

The LayerNorm site is measured with its boundary as in the model: under the fp32 residual its output also goes,
in bf16, to the next GEMM, and in backward the GEMM's gradient comes back beside the residual path's. So every
variant returns (out, bf16 copy) and takes both gradients: the composition pays autocast's cast and autograd's add
(the compiled one as Inductor fuses them), the fused op writes the copy and adds the gradients in its kernel.
Before the timings, the byte count per site of `bert_core.kernels.traffic` (the same passes) is printed.
"""
from __future__ import annotations

import argparse
import functools
import logging
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import traffic
from .bias_gelu import bias_gelu
from .dropout_layer_norm import dropout_add_layer_norm_and_copy

logger = logging.getLogger(__name__)


def _time(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """Median milliseconds per call after two warm-up calls (compilation, autotuning)."""
    for _ in range(2):
        fn()
    samples = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _fwd_bwd(fn: Callable[..., object], inputs: list[torch.Tensor], dy: object) -> Callable[[], None]:
    """dy: the gradient of fn's output, or a tuple of gradients for a tuple of outputs."""
    def step() -> None:
        for t in inputs:
            t.grad = None
        out = fn(*inputs)
        if isinstance(out, tuple):
            torch.autograd.backward(list(out), list(dy))
        else:
            out.backward(dy)
    return step


def _variants(composition: Callable[..., torch.Tensor], fused: Callable[..., torch.Tensor], compile_: bool):
    out = {"eager": composition}
    if compile_:
        out["compiled"] = torch.compile(composition, dynamic=False)
    out["fused"] = fused
    return out


def _report(name: str, shape: str, variants: dict, inputs: list[torch.Tensor], dy: torch.Tensor,
            fwd_bytes: int, bwd_bytes: int, device: torch.device, iters: int) -> None:
    times = {}
    for variant, fn in variants.items():
        with torch.no_grad():
            fwd = _time(functools.partial(fn, *inputs), device, iters)
        both = _time(_fwd_bwd(fn, inputs, dy), device, iters)
        times[variant] = (fwd, both)
        logger.info("%-22s %-10s %-9s fwd %8.3f ms (%6.0f GB/s)  fwd+bwd %8.3f ms (%6.0f GB/s)", name, shape,
                    variant, fwd, fwd_bytes / fwd / 1e6, both, (fwd_bytes + bwd_bytes) / both / 1e6)
    peer = "compiled" if "compiled" in times else "eager"
    logger.info("%s speedup_vs_%s fwd=%.2f fwd+bwd=%.2f", name, peer, times[peer][0] / times["fused"][0],
                times[peer][1] / times["fused"][1])


def bench_dropout_layer_norm(device: torch.device, rows: int, hidden: int, p: float, low_precision: bool,
                             iters: int, compile_: bool) -> None:
    x = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    res_dtype = torch.bfloat16 if low_precision else torch.float32  # the residual stream: bf16, or fp32 (autocast)
    r = torch.randn(rows, hidden, device=device, dtype=res_dtype, requires_grad=True)
    w = torch.ones(hidden, device=device, requires_grad=True)
    b = torch.zeros(hidden, device=device, requires_grad=True)
    copy = not low_precision  # an fp32 stream feeds the next GEMM through a bf16 copy

    def composition(x, r, w, b):
        # What BertSelfOutput/BertOutput compute under bf16 autocast: LayerNorm runs in fp32, autocast casts its
        # output for the next GEMM, autograd adds the two gradients that come back.
        out = F.layer_norm(F.dropout(x, p).float() + r.float(), (hidden,), w, b, 1e-12).to(res_dtype)
        return (out, out.to(torch.bfloat16)) if copy else out

    def fused(x, r, w, b):
        out, out_copy = dropout_add_layer_norm_and_copy(x, r, w, b, p=p, eps=1e-12, out_dtype=res_dtype,
                                                        copy_dtype=torch.bfloat16 if copy else None)
        return (out, out_copy) if copy else out

    counts = traffic.site_bytes(rows, hidden, "fused", low_precision)
    for line in traffic.table(rows, hidden, low_precision):
        logger.info("%s", line)
    dy = torch.randn(rows, hidden, device=device, dtype=res_dtype)
    grads = (dy, torch.randn(rows, hidden, device=device, dtype=torch.bfloat16)) if copy else dy
    name = "dropout_add_layer_norm" + ("[bf16 stream]" if low_precision else "")
    _report(name, f"{rows}x{hidden}", _variants(composition, fused, compile_), [x, r, w, b], grads,
            counts["forward"], counts["backward"], device, iters)


def bench_bias_gelu(device: torch.device, rows: int, intermediate: int, iters: int, compile_: bool) -> None:
    h = torch.randn(rows, intermediate, device=device, dtype=torch.bfloat16, requires_grad=True)
    bias = torch.zeros(intermediate, device=device, requires_grad=True)

    def composition(h, bias):
        return F.gelu(h + bias.to(h.dtype))

    def fused(h, bias):
        return bias_gelu(h, bias)

    fwd_bytes = rows * intermediate * 2 * 2  # read h, write y (bf16)
    bwd_bytes = rows * intermediate * 2 * 3  # read dy, h; write dh
    _report("bias_gelu", f"{rows}x{intermediate}", _variants(composition, fused, compile_), [h, bias],
            torch.randn(rows, intermediate, device=device, dtype=torch.bfloat16), fwd_bytes, bwd_bytes, device,
            iters)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=128 * 256, help="tokens per step (seq x batch)")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="skip the torch.compile'd composition (the peer)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = torch.device(args.device)
    if device.type == "cuda":
        logger.info("device: %s, torch %s", torch.cuda.get_device_name(device), torch.__version__)
    for low_precision in (False, True):
        bench_dropout_layer_norm(device, args.rows, args.hidden, args.dropout, low_precision, args.iters,
                                 args.compile)
    bench_bias_gelu(device, args.rows, args.intermediate, args.iters, args.compile)


if __name__ == "__main__":
    main()
