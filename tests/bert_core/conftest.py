"""bert_core tests run tiny models: one intra-op thread avoids OpenMP barrier stalls when the 2 CPUs are shared
(tiny ops are dominated by thread hand-offs, and a descheduled worker stalls every parallel region).

Where there is no GPU, the fused kernels (bert_core/kernels) run under Triton's interpreter: TRITON_INTERPRET=1
has to be in the environment before triton is imported, and nothing imports it before these tests are collected.
On a GPU machine it stays unset, so the gpu-marked kernel tests run the compiled kernels."""
import os

import torch

torch.set_num_threads(1)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
