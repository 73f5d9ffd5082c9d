"""Triton kernels for y = GELU(h + bias) over an (M, N) matrix (the FFN's 3072-wide activation), and its backward:
dh = dy * GELU'(h + bias) with the bias gradient summed in the same pass. Imported only on the first fused call (it
imports triton); launched by `bert_core.kernels.bias_gelu`.

GELU is the exact erf form (HF's "gelu", the default) or, with TANH, the tanh approximation ("gelu_new" /
"gelu_pytorch_tanh"). Math in fp32 whatever the input dtype. Triton 3.6 has `tl.erf` but no `tl.tanh`: tanh comes
from exp (see _tanh_sech2).
"""
import triton
import triton.language as tl

# Globals a kernel reads must be constexpr (compiled Triton refuses others; the interpreter would not notice).
_SQRT_HALF = tl.constexpr(0.7071067811865476)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)


@triton.jit
def _tanh_sech2(z):
    """tanh(z) and 1 - tanh(z)**2 from e = exp(-2|z|) <= 1: no overflow, and 1 - tanh**2 = 4e / (1 + e)**2 keeps
    its relative precision where tanh is near +-1 (1 - t * t would cancel)."""
    e = tl.exp(-2.0 * tl.abs(z))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(z < 0, -t, t), 4.0 * e / ((1.0 + e) * (1.0 + e))


@triton.jit
def _gelu(u, TANH: tl.constexpr):
    if TANH:
        t, _ = _tanh_sech2(_SQRT_2_OVER_PI * (u + 0.044715 * u * u * u))
        y = 0.5 * u * (1.0 + t)
    else:
        y = 0.5 * u * (1.0 + tl.erf(u * _SQRT_HALF))
    return y


@triton.jit
def _gelu_grad(u, TANH: tl.constexpr):
    if TANH:
        t, sech2 = _tanh_sech2(_SQRT_2_OVER_PI * (u + 0.044715 * u * u * u))
        d = 0.5 * (1.0 + t) + 0.5 * u * sech2 * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * u * u)
    else:
        d = 0.5 * (1.0 + tl.erf(u * _SQRT_HALF)) + u * tl.exp(-0.5 * u * u) * _INV_SQRT_2PI
    return d


@triton.jit
def forward_kernel(H, Bias, Y, M, N, TANH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    inside = (rows < M) & (cols < N)
    u = tl.load(H + rows * N + cols, mask=inside, other=0.0).to(tl.float32)
    u += tl.load(Bias + cols, mask=cols < N, other=0.0).to(tl.float32)
    tl.store(Y + rows * N + cols, _gelu(u, TANH).to(Y.dtype.element_ty), mask=inside)


@triton.jit
def backward_kernel(DY, H, Bias, DH, DB_partial, M, N, TANH: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, ITERS: tl.constexpr):
    """Program (i, j) takes rows [i * ITERS * BLOCK_M, (i + 1) * ITERS * BLOCK_M) of column block j and writes its
    column sums of dh (the bias gradient's partial) to row i of DB_partial; the launcher adds those rows up."""
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    bias = tl.load(Bias + cols, mask=cols < N, other=0.0).to(tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    for it in range(0, ITERS):
        rows = (tl.program_id(0) * ITERS + it) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
        inside = (rows < M) & (cols < N)
        u = tl.load(H + rows * N + cols, mask=inside, other=0.0).to(tl.float32) + bias
        dy = tl.load(DY + rows * N + cols, mask=inside, other=0.0).to(tl.float32)
        dh = tl.where(inside, dy * _gelu_grad(u, TANH), 0.0)
        tl.store(DH + rows * N + cols, dh.to(DH.dtype.element_ty), mask=inside)
        db += tl.sum(dh, axis=0)
    out_cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(DB_partial + tl.program_id(0) * N + out_cols, db, mask=out_cols < N)
