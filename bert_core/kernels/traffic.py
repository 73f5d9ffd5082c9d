"""Bytes moved per dropout + residual + LayerNorm site, counted pass by pass: the fused op against what it replaces.

How it counts (issue 24). A site turns x (the sublayer's output, bf16 under autocast) and the residual (fp32 by
default) into out = LayerNorm(dropout(x) + residual); out is the next residual and, cast to bf16, the next GEMM's
input, so in backward it receives two gradients (the residual path's, fp32, and the GEMM's, bf16). Every pass over
(rows, hidden) tensors is listed with the bytes per element it reads and writes; a site's bytes are the sum times
rows x hidden, plus 8 bytes per row for LayerNorm's mean and 1/std where they are stored and read back. Weight and
bias vectors and the backward's per-program dW/dB partial sums (a few hundred rows of `hidden`) are left out: under
0.1% at BERT sizes. Bytes a pass moves are counted as if each touched byte crossed DRAM once (no cache reuse).

Four ways to run a site, the first three what the fused op is measured against:
- `composition`: eager PyTorch under autocast, one pass per aten op: dropout (writes the kept values and the bool
  mask), the bf16 + fp32 add, fp32 LayerNorm, autocast's cast of out for the GEMM; backward: the GEMM gradient's
  cast back to fp32, autograd's add of the two gradients, LayerNorm's input gradient and (a second kernel in CUDA's
  LayerNorm backward) its weight gradients, the add's cast of x's gradient to bf16, dropout's backward.
- `inductor`: the same composition fused by Inductor at its best, one kernel each way (mask saved as one byte,
  the LayerNorm input recomputed from x and residual in backward, weight gradients in the same kernel). This is a
  lower bound, not a profile: the H100 profile (2026-11-24) measured 198 + 161 us per site at 128 x 256.
- `fused_op_alone`: the fused op as it was before issue 24, a custom op opaque to Inductor, so Inductor adds
  autocast's cast of out (forward) and the gradient add with the bf16 -> fp32 cast folded in (backward).
- `fused`: the fused op with its boundary: it writes the bf16 copy itself and adds the two gradients itself.

`python -m bert_core.kernels.bench` prints this table beside its timings. At 128 x 256 rows, H = 768, fp32
residual: composition 78 B/element, inductor 32, fused_op_alone 42, fused 30 (0.38x the composition, 0.71x the
op alone, 0.94x Inductor's one-pass bound: against Inductor the fused op saves Philox work, 8 keep decisions per
call instead of one, not bytes). With the bf16 residual (`low_precision_residual`) out is its own GEMM input.
"""
from __future__ import annotations

from dataclasses import dataclass

FP32, BF16, MASK = 4, 2, 1


@dataclass(frozen=True)
class Pass:
    """One pass over the (rows, hidden) tensors: bytes per element read and written, and bytes per row (stats)."""

    name: str
    """What the pass does, as the table prints it."""
    backward: bool
    """True for a pass of the backward."""
    read: int
    """Bytes read per (row, hidden) element."""
    write: int
    """Bytes written per (row, hidden) element."""
    per_row: int = 0
    """Bytes moved per row besides: 8 where LayerNorm's fp32 mean and 1/std are stored or read back."""


def passes(variant: str, x: int = BF16, residual: int = FP32, gemm: int = BF16) -> list[Pass]:
    """The passes of one site. x, residual, gemm: bytes per element of the sublayer output, the residual stream
    and the next GEMM's input (equal to residual when the stream is already in the GEMM's dtype: no copy)."""
    copy = gemm != residual  # a separate bf16 copy for the GEMM exists only with a wider residual stream
    stats = 8  # mean and 1/std, fp32 each, per row
    if variant == "composition":
        out = [Pass("dropout", False, x, x + MASK),
               Pass("add", False, x + residual, residual),
               Pass("layer_norm", False, residual, residual, stats)]
        if copy:
            out += [Pass("autocast cast for the GEMM", False, residual, gemm),
                    Pass("cast of the GEMM's gradient", True, gemm, residual)]
        out += [Pass("add of the two gradients", True, 2 * residual, residual),
                Pass("layer_norm backward (input)", True, 2 * residual, residual, stats),
                Pass("layer_norm backward (weights)", True, 2 * residual, 0, stats)]
        if x != residual:
            out.append(Pass("add backward: cast of x's gradient", True, residual, x))
        return out + [Pass("dropout backward", True, x + MASK, x)]
    if variant == "inductor":
        return [Pass("fused forward", False, x + residual, residual + (gemm if copy else 0) + MASK),
                Pass("fused backward", True, residual + (gemm if copy else 0) + x + residual + MASK, residual + x)]
    if variant == "fused_op_alone":
        out = [Pass("op forward", False, x + residual, residual, stats)]
        if copy:
            out.append(Pass("autocast cast for the GEMM", False, residual, gemm))
        return out + [Pass("add of the two gradients (cast folded in)", True, residual + gemm, residual),
                      Pass("op backward", True, residual + x + residual, x + residual, stats)]
    if variant == "fused":
        if not copy:  # one output read by both the GEMM and the next residual: autograd adds its two gradients
            return [Pass("op forward", False, x + residual, residual, stats),
                    Pass("add of the two gradients", True, 2 * residual, residual),
                    Pass("op backward", True, residual + x + residual, x + residual, stats)]
        return [Pass("op forward (+ the GEMM's copy)", False, x + residual, residual + gemm, stats),
                Pass("op backward (both gradients in)", True, residual + gemm + x + residual, x + residual, stats)]
    raise ValueError(f"unknown variant {variant!r}: one of {VARIANTS}")


VARIANTS = ("composition", "inductor", "fused_op_alone", "fused")


def site_bytes(rows: int, hidden: int, variant: str = "fused", low_precision_residual: bool = False) -> dict:
    """Bytes one site moves: {"forward", "backward", "total"} for `rows` x `hidden` under bf16 autocast, with the
    default fp32 residual stream or the bf16 one."""
    residual = BF16 if low_precision_residual else FP32
    sums = {"forward": 0, "backward": 0}
    for p in passes(variant, BF16, residual, BF16):
        sums["backward" if p.backward else "forward"] += rows * hidden * (p.read + p.write) + rows * p.per_row
    return {**sums, "total": sums["forward"] + sums["backward"]}


def table(rows: int, hidden: int, low_precision_residual: bool = False) -> list[str]:
    """One line per variant: MB forward / backward / total and the ratio of `fused` to it."""
    fused = site_bytes(rows, hidden, "fused", low_precision_residual)["total"]
    stream = "bf16" if low_precision_residual else "fp32"
    lines = [f"bytes per site, {rows} rows x {hidden}, {stream} residual (bert_core/kernels/traffic.py):"]
    for variant in VARIANTS:
        b = site_bytes(rows, hidden, variant, low_precision_residual)
        lines.append(f"  {variant:15s} fwd {b['forward'] / 1e6:7.1f} MB  bwd {b['backward'] / 1e6:7.1f} MB  "
                     f"total {b['total'] / 1e6:7.1f} MB  fused/this {fused / b['total']:.2f}")
    return lines


__all__ = ["Pass", "VARIANTS", "passes", "site_bytes", "table"]
