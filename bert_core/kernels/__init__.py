"""Fused GPU kernels for what the GEMMs leave in a BERT step (issue 16), chosen per call by `KernelOptions`.

- `dropout_layer_norm`: out = LayerNorm(dropout(x) + residual), forward and backward, for `BertSelfOutput` and
  `BertOutput`; masks from Philox with 8 keep decisions per call, recomputed in backward from (seed, offset).
  Opt-in (`KernelOptions(fused=True)`, `--fused-kernels on`): the default is Inductor's composition, the measured
  path, until a GPU run shows the op >= 3% faster per step (`options.FUSED_BY_DEFAULT`; by the byte count below it
  can gain 1-4% at most at the default fp32 residual). Its boundary takes over what Inductor fused around
  LayerNorm (issue 24): under autocast the forward also writes the bf16 copy the next GEMM reads, and the
  backward takes that GEMM's gradient beside the residual path's and adds them in the kernel; the encoder hands
  each copy to the next GEMM (`residual_layer_norm_and_copy`).
- `traffic`: the bytes per site, pass by pass, of the composition, Inductor's one-pass bound, the op before its
  boundary and the op with it (`site_bytes(rows, hidden, variant)`; how it counts is in its docstring). At
  128 x 256 x 768 with the default fp32 residual: 0.38x the PyTorch composition's bytes, 0.71x the op alone with
  the passes its boundary added, 0.94x Inductor's one-kernel-each-way bound (there the saving is Philox work).
- `bias_gelu`: GELU(h + bias) with dGELU and the bias gradient in one backward pass, for `BertIntermediate`.
  Opt-in (`KernelOptions(fused_bias_gelu=True)`): its module says why it is not shown to win.
- `options`: `KernelOptions` and `set_kernel_options(model, options)`; `bench`: the GPU measurements.
- `self_check`: each kernel in use against the composition at a run's shapes, once at worker start; a kernel that
  disagrees or raises is switched off with one WARNING line, one that faults the device ends the run naming it
  (pretraining/kernel_options.py calls it).

Triton is optional (the `gpu` extra); nothing here imports it until a fused call runs. The CPU path is unchanged.

Not measured yet (no GPU was lent while this was written); `python benchmarks/gpu_suite.py --call 1` measures the
kernels at training shapes and the step with them on and off (docs/benchmarks.md § GPU); the commands for the
kernels alone, one line each on a CUDA machine:
    python -m bert_core.kernels.bench                      # byte counts, then each kernel vs eager and compiled
    python -m pytest -m gpu tests/bert_core                # the kernel tests on the compiled kernels
    python benchmarks/gpu_step.py --shapes 128x256x20 --fused-kernels on   # the whole step with the LayerNorm op
Whether `KernelOptions(low_precision_residual=True)` (a bf16 residual stream) keeps the fp32 loss curve needs a
2,000-step bf16 run with and without it (`jobs/pretrain.py --use-gpu --fused-kernels on --low-precision-residual`
against the same command without the last flag; docs/benchmarks.md § GPU).

Looked at and not done: QKV gradients written into one buffer. Every attention backward op of torch 2.13 (schemas
read here: `_scaled_dot_product_{cudnn,flash,efficient}_attention_backward`, `_flash_attention_backward`) returns
freshly allocated dq, dk, dv and takes no output buffers, so the (B, T, 3H) gradient of the fused QKV projection
is one concatenation after it (302 MB read + written per layer at seq 128 x 256, BERT-base: ~0.09 ms at an H100's
3.35 TB/s, an estimate). Splitting the QKV Linear's
backward into three GEMMs that read dq, dk and dv in place would avoid the copy but accumulates dx three times,
moving about as many bytes. Writing into one buffer needs an attention backward that takes its outputs (cuDNN's
frontend API or flash-attn's packed-QKV path; neither ships in torch).
"""
from .bias_gelu import bias_gelu, linear_gelu
from .dropout_layer_norm import (
                                 dropout_add_layer_norm,
                                 dropout_add_layer_norm_and_copy,
                                 keep_mask,
                                 residual_layer_norm,
                                 residual_layer_norm_and_copy,
)
from .options import DEFAULT, TRITON_INSTALLED, KernelOptions, set_kernel_options

__all__ = ["DEFAULT", "KernelOptions", "TRITON_INSTALLED", "bias_gelu", "dropout_add_layer_norm",
           "dropout_add_layer_norm_and_copy", "keep_mask", "linear_gelu", "residual_layer_norm",
           "residual_layer_norm_and_copy", "set_kernel_options"]
