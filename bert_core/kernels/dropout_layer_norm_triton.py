"""Triton kernels for out = LayerNorm(dropout(x) + residual) over rows of N features: forward, backward, and the
keep mask alone (for tests). Imported only on the first fused call (it imports triton); launched by
`bert_core.kernels.dropout_layer_norm`.

The dropout mask is a function of (seed, offset, row, column), recomputed in backward instead of stored:
element (row, c) takes 16-bit slice c % 8 of Philox4x32-10(key = seed, counter = (c // 8, row, offset, 0)), the
same generator as `tl.rand` (Salmon et al. 2011, Random123), read as the four 32-bit words w0..w3 split into
(w0 low, w0 high, w1 low, ..., w3 high); it keeps the element when the slice is >= round(p * 65536). One Philox
call thus serves 8 elements where `tl.rand` spends one call per element (the forward's bottleneck under Inductor),
and the keep probability is quantised to 1/65536, as `bert_core.dropout` does on CPU.

A row is one (BLOCK_G, 8) tile, column = g * 8 + lane, so each group's Philox words sit beside its 8 lanes: with a
bf16 x, Triton gives each thread one group (one 16-byte load) and one Philox call (checked on the sm_90 PTX by
tests/bert_core/test_kernel_compile.py); with an fp32 x two threads share a group and both compute it. Sums
and statistics are fp32 whatever the input dtypes; x, residual and out keep their own dtypes. Offsets are int32:
the launcher refuses tensors of 2**31 elements or more.

The boundary (issue 24): the forward also writes `Ycopy`, the low-precision copy of its output that the next GEMM
reads under autocast (HAS_COPY), and the backward takes the output's two incoming gradients as they come, `DY` from
the residual path and `DCOPY` from the next GEMM (HAS_DY / HAS_DCOPY), summing them in registers: the cast and the
add that Inductor fused into its own LayerNorm are not separate passes over the (rows, N) tensors.

Only Triton 3.6 API (torch 2.11's Triton on the GPU machines): tl.philox, tl.where, tl.sum, tl.rsqrt.
"""
import triton
import triton.language as tl


@triton.jit
def _keep_tile(seed, row, offset, threshold, BLOCK_G: tl.constexpr):
    """Bool (BLOCK_G, 8): keep decision for column g * 8 + lane of `row`."""
    g = tl.arange(0, BLOCK_G)
    zero = g * 0
    w0, w1, w2, w3 = tl.philox(seed, g, zero + row, zero + offset, zero)
    lane = tl.arange(0, 8)[None, :]
    word = tl.where(lane < 2, w0[:, None],
                    tl.where(lane < 4, w1[:, None], tl.where(lane < 6, w2[:, None], w3[:, None])))
    bits = (word >> ((lane % 2) * 16).to(tl.uint32)) & 0xFFFF
    return bits.to(tl.int32) >= threshold


@triton.jit
def keep_mask_kernel(Keep, seed_ptr, offset, threshold, N, BLOCK_G: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_G)[:, None] * 8 + tl.arange(0, 8)[None, :]
    keep = _keep_tile(tl.load(seed_ptr), row, offset, threshold, BLOCK_G)
    tl.store(Keep + row * N + cols, keep.to(tl.int8), mask=cols < N)


@triton.jit
def forward_kernel(X, R, W, B, Y, Ycopy, Mean, Rstd, seed_ptr, offset, threshold, scale, eps, N,
                   HAS_DROPOUT: tl.constexpr, HAS_COPY: tl.constexpr, BLOCK_G: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_G)[:, None] * 8 + tl.arange(0, 8)[None, :]
    inside = cols < N
    x = tl.load(X + row * N + cols, mask=inside, other=0.0).to(tl.float32)
    r = tl.load(R + row * N + cols, mask=inside, other=0.0).to(tl.float32)
    if HAS_DROPOUT:
        keep = _keep_tile(tl.load(seed_ptr), row, offset, threshold, BLOCK_G)
        x = tl.where(keep, x * scale, 0.0)
    s = x + r
    mean = tl.sum(tl.sum(s, axis=1), axis=0) / N
    centred = tl.where(inside, s - mean, 0.0)
    # Two passes over registers (mean, then centred squares): no cancellation, the row is already loaded.
    var = tl.sum(tl.sum(centred * centred, axis=1), axis=0) / N
    rstd = tl.rsqrt(var + eps)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=inside, other=0.0).to(tl.float32)
    y = centred * rstd * w + b
    tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=inside)
    if HAS_COPY:
        # Compiled, the cast rounds to nearest even, as autocast's cast of the stored output does (Triton's
        # interpreter truncates instead; the tests allow for it).
        tl.store(Ycopy + row * N + cols, y.to(Ycopy.dtype.element_ty), mask=inside)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)


@triton.jit
def backward_kernel(DY, DCOPY, X, R, W, Mean, Rstd, DX, DR, DW_partial, DB_partial, seed_ptr, offset, threshold,
                    scale, M, N, HAS_DROPOUT: tl.constexpr, HAS_DY: tl.constexpr, HAS_DCOPY: tl.constexpr,
                    BLOCK_G: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr):
    """Each program takes ROWS_PER_PROGRAM consecutive rows and writes its partial sums of dW and dB (one row of
    DW_partial / DB_partial each); the launcher adds those rows up. The output's gradient is DY + DCOPY (either
    may be absent), summed in fp32 as autograd's add of the two would be."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_G)[:, None] * 8 + tl.arange(0, 8)[None, :]
    inside = cols < N
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_G, 8], dtype=tl.float32)
    db = tl.zeros([BLOCK_G, 8], dtype=tl.float32)
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(seed_ptr)
    # A constexpr trip count (a power of two, so few variants compile): Triton 3.6's interpreter cannot take a
    # runtime int as a loop bound under NumPy 2.
    for i in range(0, ROWS_PER_PROGRAM):
        # The last program may run past M: its extra rows load zeros (dy = 0 adds nothing) and store nothing.
        row = pid * ROWS_PER_PROGRAM + i
        ok = inside & (row < M)
        x = tl.load(X + row * N + cols, mask=ok, other=0.0).to(tl.float32)
        r = tl.load(R + row * N + cols, mask=ok, other=0.0).to(tl.float32)
        dy = tl.zeros([BLOCK_G, 8], dtype=tl.float32)
        if HAS_DY:
            dy += tl.load(DY + row * N + cols, mask=ok, other=0.0).to(tl.float32)
        if HAS_DCOPY:
            dy += tl.load(DCOPY + row * N + cols, mask=ok, other=0.0).to(tl.float32)
        if HAS_DROPOUT:
            keep = _keep_tile(seed, row, offset, threshold, BLOCK_G)
            x = tl.where(keep, x * scale, 0.0)
        mean = tl.load(Mean + row, mask=row < M, other=0.0)
        rstd = tl.load(Rstd + row, mask=row < M, other=0.0)
        xhat = tl.where(ok, (x + r - mean) * rstd, 0.0)
        g = dy * w
        # d LayerNorm: rstd * (g - mean(g) - xhat * mean(g * xhat)), padding columns contribute zeros to both means.
        mean_gx = tl.sum(tl.sum(g * xhat, axis=1), axis=0) / N
        mean_g = tl.sum(tl.sum(g, axis=1), axis=0) / N
        ds = tl.where(ok, (g - xhat * mean_gx - mean_g) * rstd, 0.0)
        tl.store(DR + row * N + cols, ds.to(DR.dtype.element_ty), mask=ok)
        if HAS_DROPOUT:
            ds = tl.where(keep, ds * scale, 0.0)
        tl.store(DX + row * N + cols, ds.to(DX.dtype.element_ty), mask=ok)
        dw += dy * xhat
        db += dy
    tl.store(DW_partial + pid * N + cols, dw, mask=inside)
    tl.store(DB_partial + pid * N + cols, db, mask=inside)
