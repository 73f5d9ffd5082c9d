"""GELU(h + bias) as one fused op whose backward computes dGELU and the bias gradient in one pass: the FFN's
`BertIntermediate` with `KernelOptions(fused_bias_gelu=True)` runs its GEMM without bias and this op after it.

Off by default, because it is not shown to win. Per element of the (tokens x 3072) activation, in bf16:
- forward: this op reads h and writes y (4 bytes), which is what Inductor's own fusion of the bias add into the
  GELU after a bias-free GEMM already does; only eager mode saves a pass (addmm's bias epilogue + a GELU pass).
- backward: this op reads dy and h and writes dh (6 bytes) while summing the bias gradient in registers; unfused
  it is dGELU (6 bytes) plus a column sum that reads dh again (2 more), which Inductor may or may not fuse.
So the best case is ~25% of the GELU backward's traffic, ~1 ms of the ~5 ms that GELU forward + backward +
bias sums take in a BERT-base step at seq 128 x 256 on an H100 (../shared/GPU.md's profile), unmeasured.
What would win more is the GEMM epilogue (bias + GELU in the GEMM, dGELU in the backward GEMM), which torch does
not offer for erf GELU; see bert_core/kernels/__init__.py.

Exact erf GELU by default (HF's "gelu", parity with transformers); "gelu_new" / "gelu_pytorch_tanh" take the tanh
form, as the model's config says. Registered through `torch.library` like the LayerNorm op: one node each way
under torch.compile.
"""
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .options import KernelOptions, check_device

# hidden_act -> the kernel's GELU form; other activations (relu) keep the Linear + activation composition.
GELU_FORMS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
_BLOCK_M, _BLOCK_N = 16, 256


def _kernels():
    from . import bias_gelu_triton

    return bias_gelu_triton


@torch.library.custom_op("bert_core::bias_gelu_fwd", mutates_args=())
def _forward(h: Tensor, bias: Tensor, approximate: str) -> Tensor:
    check_device(h)
    n = h.shape[-1]
    h2 = h.reshape(-1, n).contiguous()
    m = h2.shape[0]
    y = torch.empty(h.shape, dtype=h.dtype, device=h.device)
    if m:
        grid = (-(-m // _BLOCK_M), -(-n // _BLOCK_N))
        _kernels().forward_kernel[grid](h2, bias.contiguous(), y, m, n, TANH=approximate == "tanh",
                                        BLOCK_M=_BLOCK_M, BLOCK_N=_BLOCK_N, num_warps=4)
    return y


@_forward.register_fake
def _(h, bias, approximate):
    return h.new_empty(h.shape)  # contiguous, like the real output


@torch.library.custom_op("bert_core::bias_gelu_bwd", mutates_args=())
def _backward(dy: Tensor, h: Tensor, bias: Tensor, approximate: str) -> tuple[Tensor, Tensor]:
    n = h.shape[-1]
    h2, dy2 = h.reshape(-1, n).contiguous(), dy.reshape(-1, n).contiguous()
    m = h2.shape[0]
    dh = torch.empty(h.shape, dtype=h.dtype, device=h.device)
    if not m:
        return dh, torch.zeros_like(bias)
    # Each program sums ITERS x BLOCK_M rows: few partial rows to add up, still thousands of programs at BERT sizes.
    iters = min(8, 1 << (max(1, -(-m // _BLOCK_M)) - 1).bit_length())
    row_programs = -(-m // (_BLOCK_M * iters))
    db_partial = torch.empty(row_programs, n, dtype=torch.float32, device=h.device)
    _kernels().backward_kernel[(row_programs, -(-n // _BLOCK_N))](
        dy2, h2, bias.contiguous(), dh, db_partial, m, n, TANH=approximate == "tanh", BLOCK_M=_BLOCK_M,
        BLOCK_N=_BLOCK_N, ITERS=iters, num_warps=4)
    return dh, db_partial.sum(0).to(bias.dtype)


@_backward.register_fake
def _(dy, h, bias, approximate):
    return h.new_empty(h.shape), bias.new_empty(bias.shape)


def _setup_context(ctx, inputs, output) -> None:
    h, bias, approximate = inputs
    ctx.save_for_backward(h, bias)
    ctx.approximate = approximate


def _autograd_backward(ctx, dy):
    h, bias = ctx.saved_tensors
    dh, db = _backward(dy, h, bias, ctx.approximate)
    return dh, db, None


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def bias_gelu(h: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    """`F.gelu(h + bias, approximate=approximate)` in one kernel, the bias broadcast over h's last dimension."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' (erf GELU) or 'tanh', got {approximate!r}")
    if bias.shape != (h.shape[-1],):
        raise ValueError(f"bias {tuple(bias.shape)} must be ({h.shape[-1]},), the size of h's last dimension")
    if h.numel() >= 2**31:
        raise ValueError(f"h has {h.numel()} elements; the fused kernel takes < 2**31, split the batch")
    return _forward(h, bias, approximate)


def linear_gelu(x: Tensor, dense: nn.Linear, hidden_act: str, act: Callable[[Tensor], Tensor],
                options: KernelOptions) -> Tensor:
    """A BERT FFN input: `act(dense(x))`, or the bias-free GEMM + `bias_gelu` when `options` asks for it and the
    activation is a GELU."""
    form = GELU_FORMS.get(hidden_act)
    if not (options.fused_bias_gelu and form is not None and options.use_fused(x)):
        return act(dense(x))
    return bias_gelu(F.linear(x, dense.weight), dense.bias, form)


__all__ = ["GELU_FORMS", "bias_gelu", "linear_gelu"]
