"""The fused kernels at training shapes on a GPU (issue 24): what the interpreter tests cannot reach. BERT-base's
seq 128 x 256 is 32,768 rows; there the LayerNorm backward runs 8-32 rows per program (the multi-row loop) and the
bias + GELU backward its full ITERS; checked forward and backward against the PyTorch composition at H = 768 and
1,024 (BERT-large), with dropout, the bf16 copy and both incoming gradients, and through the start-of-run
self-check at the same shapes. Skipped without a GPU."""
from __future__ import annotations

import pytest
import torch
from test_kernel_boundary import check_site

from bert_core.kernels import KernelOptions
from bert_core.kernels.dropout_layer_norm import _rows_per_program
from bert_core.kernels.self_check import self_check

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ROWS = 128 * 256


@pytest.mark.parametrize("hidden", [768, 1024])
def test_layer_norm_at_training_shapes_matches_the_composition(hidden):
    per_program = _rows_per_program(torch.device("cuda"), ROWS)
    assert per_program >= 8, per_program  # the multi-row backward loop, as training runs it
    check_site("cuda", rows=ROWS, n=hidden, p=0.1)
    check_site("cuda", rows=ROWS + 37, n=hidden, p=0.1)  # a last program only partly inside


@pytest.mark.parametrize("hidden, intermediate", [(768, 3072), (1024, 4096)])
def test_self_check_passes_every_kernel_at_training_shapes(hidden, intermediate):
    for residual_bf16 in (False, True):
        options = KernelOptions(fused=True, fused_bias_gelu=True, low_precision_residual=residual_bf16)
        results = self_check(ROWS, hidden, intermediate, torch.device("cuda"), options)
        assert set(results) == {"dropout_layer_norm", "bias_gelu"}
        assert all(r.ok for r in results.values()), results
