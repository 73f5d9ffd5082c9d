"""out = LayerNorm(dropout(x) + residual) as one fused op (forward and backward), the post-LN residual sites of BERT.

Registered with `torch.library` (`bert_core::dropout_add_layer_norm_fwd` / `_bwd`, a fake implementation each and
the backward wired through `register_autograd`), so `torch.compile` keeps each as one node with its autograd and
no graph break. The kernels are Triton (`dropout_layer_norm_triton.py`, imported on first use); on CPU tensors they
run only under Triton's interpreter, which the tests use.

Memory traffic per element, forward: read x and residual, write out and (under autocast, for the next GEMM) its
bf16 copy; backward: read the two incoming gradients (the residual path's and the next GEMM's), x and residual,
write dx and dresidual. `traffic.site_bytes` counts it against the composition it replaces. Saved for backward:
the inputs x and residual, the seed (a one-element int64 tensor) and LayerNorm's mean and 1/std (two fp32 numbers
per row); the dropout mask is recomputed from (seed, offset), never stored.

Seeds: a site draws its seed with `torch.randint` on the input's device, so the mask follows torch's RNG state
(`torch.manual_seed` before a step fixes every mask of that step: resume is exact) with no host sync; each draw
advances the generator, so sites and steps get different masks. `offset` separates streams that share a seed.
Under `torch.compile` the draw is a node of the graph, and AOTAutograd's partitioner saves random ops' outputs
rather than recomputing them in backward, so backward sees the forward's seed (tests/bert_core checks both).
"""

import torch
from torch import Tensor, nn

from .options import KernelOptions, check_device

_LEVELS = 1 << 16
_MAX_ELEMENTS = 2**31  # int32 offsets inside the kernels


def _kernels():
    from . import dropout_layer_norm_triton

    return dropout_layer_norm_triton


def _block_g(n: int) -> int:
    return 1 << (max(1, (n + 7) // 8) - 1).bit_length()


def _num_warps(n: int) -> int:
    return min(max(8 * _block_g(n) // 256, 1), 8)


def _threshold(p: float) -> int:
    return round(p * _LEVELS)


_SM_COUNT: dict[int, int] = {}


def _rows_per_program(device: torch.device, rows: int) -> int:
    """Backward: enough programs for a few per SM, each summing its rows' dW/dB partials in registers; a power of
    two so that only a handful of kernel variants compile whatever the batch shapes."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in _SM_COUNT:
            _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
        programs = 8 * _SM_COUNT[index]
    else:
        programs = 4
    return 1 << (max(1, -(-rows // programs)) - 1).bit_length()


# ---- the ops -------------------------------------------------------------------------------------------------------
@torch.library.custom_op("bert_core::dropout_add_layer_norm_fwd", mutates_args=())
def _forward(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, seed: Tensor | None, offset: int,
             p: float, eps: float, out_dtype: torch.dtype,
             copy_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (out, copy, mean, rstd); `copy` is out in `copy_dtype` for the next GEMM, or an empty tensor."""
    check_device(x)
    n = x.shape[-1]
    x2, r2 = x.reshape(-1, n).contiguous(), residual.reshape(-1, n).contiguous()
    m = x2.shape[0]
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    copy = torch.empty(x.shape if copy_dtype is not None else (0,), dtype=copy_dtype or out_dtype, device=x.device)
    mean = torch.empty(m, dtype=torch.float32, device=x.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        has_dropout = p > 0.0
        _kernels().forward_kernel[(m,)](
            x2, r2, weight.contiguous(), bias.contiguous(), out, copy if copy_dtype is not None else None, mean, rstd,
            seed if has_dropout else None, offset, _threshold(p), 1.0 / (1.0 - p), eps, n,
            HAS_DROPOUT=has_dropout, HAS_COPY=copy_dtype is not None, BLOCK_G=_block_g(n),
            num_warps=_num_warps(n))
    return out, copy, mean, rstd


@_forward.register_fake
def _(x, residual, weight, bias, seed, offset, p, eps, out_dtype, copy_dtype=None):
    m = x.numel() // x.shape[-1]
    copy = x.new_empty(x.shape if copy_dtype is not None else (0,), dtype=copy_dtype or out_dtype)
    return (x.new_empty(x.shape, dtype=out_dtype), copy, x.new_empty(m, dtype=torch.float32),
            x.new_empty(m, dtype=torch.float32))


@torch.library.custom_op("bert_core::dropout_add_layer_norm_bwd", mutates_args=())
def _backward(dy: Tensor | None, dcopy: Tensor | None, x: Tensor, residual: Tensor, weight: Tensor,
              seed: Tensor | None, mean: Tensor, rstd: Tensor, offset: int,
              p: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of x, residual, weight and bias for the output gradient dy + dcopy (either may be None)."""
    n = x.shape[-1]
    x2, r2 = x.reshape(-1, n).contiguous(), residual.reshape(-1, n).contiguous()
    dy2 = dy.reshape(-1, n).contiguous() if dy is not None else None
    dcopy2 = dcopy.reshape(-1, n).contiguous() if dcopy is not None else None
    m = x2.shape[0]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dr = torch.empty(residual.shape, dtype=residual.dtype, device=x.device)
    if not m:
        return dx, dr, torch.zeros_like(weight), torch.zeros_like(weight)
    rows_per_program = _rows_per_program(x.device, m)
    programs = -(-m // rows_per_program)
    dw_partial = torch.empty(programs, n, dtype=torch.float32, device=x.device)
    db_partial = torch.empty(programs, n, dtype=torch.float32, device=x.device)
    has_dropout = p > 0.0
    _kernels().backward_kernel[(programs,)](
        dy2, dcopy2, x2, r2, weight.contiguous(), mean, rstd, dx, dr, dw_partial, db_partial,
        seed if has_dropout else None, offset, _threshold(p), 1.0 / (1.0 - p), m, n,
        HAS_DROPOUT=has_dropout, HAS_DY=dy is not None, HAS_DCOPY=dcopy is not None, BLOCK_G=_block_g(n),
        ROWS_PER_PROGRAM=rows_per_program, num_warps=_num_warps(n))
    return dx, dr, dw_partial.sum(0).to(weight.dtype), db_partial.sum(0).to(weight.dtype)


@_backward.register_fake
def _(dy, dcopy, x, residual, weight, seed, mean, rstd, offset, p):
    # Contiguous like the real outputs (empty_like would copy a non-contiguous input's strides).
    return x.new_empty(x.shape), residual.new_empty(residual.shape), weight.new_empty(weight.shape), \
        weight.new_empty(weight.shape)


def _setup_context(ctx, inputs, output) -> None:
    x, residual, weight, _bias, seed, offset, p, _eps, _out_dtype, copy_dtype = inputs
    _out, _copy, mean, rstd = output
    ctx.save_for_backward(x, residual, weight, seed, mean, rstd)
    ctx.offset, ctx.p, ctx.has_copy = offset, p, copy_dtype is not None


def _autograd_backward(ctx, dy, dcopy, _dmean, _drstd):
    x, residual, weight, seed, mean, rstd = ctx.saved_tensors
    # The two gradients arrive separately (the residual path's and the next GEMM's) and the kernel adds them;
    # an empty copy has no gradient to add.
    dx, dr, dw, db = _backward(dy, dcopy if ctx.has_copy else None, x, residual, weight, seed, mean, rstd,
                               ctx.offset, ctx.p)
    return dx, dr, dw, db, None, None, None, None, None, None


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


# ---- the Python API ------------------------------------------------------------------------------------------------
def draw_seed(device: torch.device) -> Tensor:
    """One int64 seed on `device` from torch's generator for that device (no host sync)."""
    return torch.randint(0, 2**62, (1,), device=device, dtype=torch.int64)


def dropout_add_layer_norm(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, p: float = 0.0,
                           eps: float = 1e-5, training: bool = True, out_dtype: torch.dtype | None = None,
                           seed: Tensor | None = None, offset: int = 0) -> Tensor:
    """`F.layer_norm(dropout(x, p) + residual, (N,), weight, bias, eps)` in one kernel, N = x.shape[-1].

    out_dtype: default the promotion of x's and residual's dtypes (fp32 for a bf16 x and an fp32 residual, as under
    autocast). seed: a one-element int64 tensor on x's device; drawn from torch's RNG when None and dropout is on.
    """
    return dropout_add_layer_norm_and_copy(x, residual, weight, bias, p, eps, training, out_dtype, None, seed,
                                           offset)[0]


def dropout_add_layer_norm_and_copy(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, p: float = 0.0,
                                    eps: float = 1e-5, training: bool = True, out_dtype: torch.dtype | None = None,
                                    copy_dtype: torch.dtype | None = None, seed: Tensor | None = None,
                                    offset: int = 0) -> tuple[Tensor, Tensor | None]:
    """`dropout_add_layer_norm`, also returning the output in `copy_dtype` (None: no copy) from the same kernel.

    Give the copy to the next GEMM and the output to the next residual: in backward both gradients come back to
    this op's one kernel, which adds them (autograd would otherwise add them in a pass of its own).
    """
    if x.shape != residual.shape:
        raise ValueError(f"x {tuple(x.shape)} and residual {tuple(residual.shape)} must have the same shape")
    n = x.shape[-1] if x.dim() else 0
    if n == 0 or weight.shape != (n,) or bias.shape != (n,):
        raise ValueError(f"LayerNorm weight {tuple(weight.shape)} and bias {tuple(bias.shape)} must be ({n},), "
                         "the size of x's last dimension")
    if weight.dtype != bias.dtype:
        raise ValueError(f"LayerNorm weight ({weight.dtype}) and bias ({bias.dtype}) must share a dtype")
    if x.numel() >= _MAX_ELEMENTS:
        raise ValueError(f"x has {x.numel()} elements; the fused kernel takes < 2**31, split the batch")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if seed is not None and (seed.shape != (1,) or seed.dtype != torch.int64 or seed.device != x.device):
        raise ValueError(f"seed must be a one-element int64 tensor on {x.device} (see draw_seed), got "
                         f"{tuple(seed.shape)} {seed.dtype} on {seed.device}")
    p = p if training else 0.0
    if p > 0.0 and seed is None:
        seed = draw_seed(x.device)
    out_dtype = out_dtype if out_dtype is not None else torch.promote_types(x.dtype, residual.dtype)
    out, copy, _mean, _rstd = _forward(x, residual, weight, bias, seed, offset, p, eps, out_dtype, copy_dtype)
    return out, (copy if copy_dtype is not None else None)


def keep_mask(seed: Tensor, rows: int, cols: int, p: float, offset: int = 0) -> Tensor:
    """The kernels' keep mask for a (rows, cols) input as a bool tensor (for tests and checks; not used in training)."""
    check_device(seed)
    keep = torch.empty(rows, cols, dtype=torch.int8, device=seed.device)
    if rows:
        _kernels().keep_mask_kernel[(rows,)](keep, seed, offset, _threshold(p), cols, BLOCK_G=_block_g(cols))
    return keep.bool()


def residual_layer_norm(x: Tensor, residual: Tensor, layer_norm: nn.LayerNorm, dropout: nn.Module,
                        options: KernelOptions) -> Tensor:
    """A BERT site: `layer_norm(dropout(x) + residual)`, fused when `options` picks the kernels for x's device.

    `dropout` is the site's dropout module (its `p` and `training` are read). With `low_precision_residual` the
    result takes x's dtype (bf16 under autocast) on either path.
    """
    return residual_layer_norm_and_copy(x, residual, layer_norm, dropout, options, copy=False)[0]


def _autocast_dtype(t: Tensor) -> torch.dtype | None:
    device_type = t.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def residual_layer_norm_and_copy(x: Tensor, residual: Tensor, layer_norm: nn.LayerNorm, dropout: nn.Module,
                                 options: KernelOptions, copy: bool = True) -> tuple[Tensor, Tensor | None]:
    """A site whose output feeds a GEMM: (out, out_for_the_gemm or None).

    Fused under autocast with an output wider than autocast's dtype (the default fp32 residual stream), the kernel
    writes the copy the next GEMM reads (what autocast's cast of `out` would give); pass it to that GEMM and `out`
    to the next residual. Otherwise (the composition, no autocast, a bf16 residual) the copy is None: use `out`
    for both, as before.
    """
    out_dtype = x.dtype if options.low_precision_residual else None
    if not (options.fused_layer_norm and options.use_fused(x)):
        out = layer_norm(dropout(x) + residual)
        return (out if out_dtype is None else out.to(out_dtype)), None
    gemm_dtype = _autocast_dtype(x) if copy else None
    final_dtype = out_dtype if out_dtype is not None else torch.promote_types(x.dtype, residual.dtype)
    return dropout_add_layer_norm_and_copy(
        x, residual, layer_norm.weight, layer_norm.bias, dropout.p, layer_norm.eps, dropout.training,
        out_dtype=out_dtype, copy_dtype=gemm_dtype if gemm_dtype not in (None, final_dtype) else None)


__all__ = ["draw_seed", "dropout_add_layer_norm", "dropout_add_layer_norm_and_copy", "keep_mask",
           "residual_layer_norm", "residual_layer_norm_and_copy"]
