"""Fused GPU kernels for what the GEMMs leave in a BERT step (issue 16), chosen per call by `KernelOptions`.

- `dropout_layer_norm`: out = LayerNorm(dropout(x) + residual), forward and backward, for `BertSelfOutput` and
  `BertOutput`; masks from Philox with 8 keep decisions per call, recomputed in backward from (seed, offset).
- `options`: `KernelOptions` (on for CUDA tensors when Triton is installed, off on CPU) and `set_kernel_options`.

Triton is optional (the `gpu` extra); nothing here imports it until a fused call runs. The CPU path is unchanged.

Not measured yet (no GPU was lent while this was written); the commands, one line each on a CUDA machine:
    python -m bert_core.kernels.bench                      # each kernel vs eager and compiled PyTorch, fwd+bwd
    python benchmarks/gpu_step.py --shapes 128x256x20      # the whole step (the kernels are on by default on CUDA)
Whether `KernelOptions(low_precision_residual=True)` (a bf16 residual stream) keeps the fp32 loss curve needs a
2,000-step bf16 run with and without it, which `training` has to expose as a flag first.
"""
from .bias_gelu import bias_gelu, linear_gelu
from .dropout_layer_norm import dropout_add_layer_norm, keep_mask, residual_layer_norm
from .options import DEFAULT, TRITON_INSTALLED, KernelOptions, set_kernel_options

__all__ = ["DEFAULT", "KernelOptions", "TRITON_INSTALLED", "bias_gelu", "dropout_add_layer_norm", "keep_mask",
           "linear_gelu", "residual_layer_norm", "set_kernel_options"]
