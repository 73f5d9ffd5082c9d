"""Shared by the fused-kernel tests: the devices they run on. "cpu" is Triton's interpreter (TRITON_INTERPRET=1, set
by tests/bert_core/conftest.py where there is no GPU); "cuda" runs the compiled kernels and carries the gpu marker.
On a GPU machine the interpreter stays off (it would make the CUDA kernels interpreted too), so the cpu cases skip
there and the cuda cases run the same checks."""
from __future__ import annotations

import os

import pytest
import torch

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1",
        reason="a GPU is present: TRITON_INTERPRET stays unset so the cuda cases run the compiled kernels")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                    reason="needs a CUDA GPU")]),
]
